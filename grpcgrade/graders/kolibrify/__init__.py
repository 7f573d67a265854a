"""Kolibrify's reward graders (kolibrify/rl_dataserver/graders.py at 1695107).

Each parses `<think>...</think>` from the response the Kolibrify way; the gold answer is `reference` and
the record's metadata is `extra.metadata`.
"""

from grpcgrade.hookspecs import hookimpl

from .category_match import CategoryMatchGrader
from .completion_length_cap import CompletionLengthCapGrader
from .json_graders import JsonSchemaGrader, JsonValidGrader
from .latex_only import LatexOnlyGrader
from .math_exact import MathExactGrader
from .number_only import NumberOnlyGrader
from .think_format import ThinkFormatGrader
from .xml_schema import XmlSchemaGrader


@hookimpl
def register_graders(register):
    register(ThinkFormatGrader, name="think_format")
    register(MathExactGrader, name="math_exact")
    register(NumberOnlyGrader, name="number_only")
    register(JsonValidGrader, name="json_valid")
    register(JsonSchemaGrader, name="json_schema")
    register(XmlSchemaGrader, name="xml_schema")
    register(CategoryMatchGrader, name="category_match")
    register(CompletionLengthCapGrader, name="completion_length_cap")
    register(LatexOnlyGrader, name="latex_only")
