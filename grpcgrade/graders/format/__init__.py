"""Format graders: structural checks of a response (JSON, length, repetition, reasoning tags).

References: RM-Gallery / OpenJudge format graders (py-openjudge 0.2.4) and Audacia's format evaluators.
"""

from grpcgrade.hookspecs import hookimpl

from .audacia import CustomResponseGrader, JsonResponseGrader
from .json_match import JsonMatchGrader
from .json_validator import JsonValidatorGrader
from .length_penalty import LengthPenaltyGrader
from .ngram_repetition_penalty import NgramRepetitionPenaltyGrader
from .reasoning_format import ReasoningFormatGrader
from .reasoning_tool_call_format import ReasoningToolCallFormatGrader
from .xml_valid import XmlValidGrader


@hookimpl
def register_graders(register):
    register(JsonValidatorGrader, name="json_validator")
    register(JsonMatchGrader, name="json_match")
    register(LengthPenaltyGrader, name="length_penalty")
    register(NgramRepetitionPenaltyGrader, name="ngram_repetition_penalty")
    register(ReasoningFormatGrader, name="reasoning_format", aliases=("format_reward",))
    register(ReasoningToolCallFormatGrader, name="reasoning_tool_call_format", aliases=("tool_call_format",))
    register(CustomResponseGrader, name="custom_response")
    register(JsonResponseGrader, name="json_response")
    register(XmlValidGrader, name="xml_valid")
