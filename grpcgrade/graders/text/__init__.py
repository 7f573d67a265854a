"""Text graders: similarity metrics, string matching and number accuracy against a reference.

Reference: RM-Gallery / OpenJudge text graders (py-openjudge 0.2.4, jieba-era tokenisation).
"""

import threading

from grpcgrade.hookspecs import hookimpl

from ..patterns import warm_up
from .number_accuracy import NumberAccuracyGrader
from .similarity import SimilarityGrader
from .string_match import StringMatchGrader
from .tokenize import initialize


@hookimpl
def register_graders(register):
    register(SimilarityGrader, name="similarity")
    register(StringMatchGrader, name="string_match")
    register(NumberAccuracyGrader, name="number_accuracy")
    # jieba's dictionary takes ~1 s to load: load it now, in the background, in every process that serves
    # these graders (the server and each worker), so neither start-up nor the first request waits for it.
    threading.Thread(target=initialize, name="jieba-initialize", daemon=True).start()
    # Likewise the table of code points that request patterns' character classes are computed from.
    threading.Thread(target=warm_up, name="patterns-warm-up", daemon=True).start()
