"""Text graders: similarity metrics, string matching and number accuracy against a reference.

Reference: RM-Gallery / OpenJudge text graders (py-openjudge 0.2.4, jieba-era tokenisation).
"""

from grpcgrade.hookspecs import hookimpl

from .number_accuracy import NumberAccuracyGrader
from .similarity import SimilarityGrader
from .string_match import StringMatchGrader


@hookimpl
def register_graders(register):
    register(SimilarityGrader, name="similarity")
    register(StringMatchGrader, name="string_match")
    register(NumberAccuracyGrader, name="number_accuracy")
