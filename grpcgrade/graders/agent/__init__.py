"""Agent, code and math graders: OpenJudge's deterministic ones outside its format and text families
(py-openjudge 0.2.4, score for score; `code_execution` is not served, it never runs code) and the structured
checks of tool calls against their definitions (`tool_call_valid`).

Inputs are the sample's agent fields (`messages`, `tool_calls`, `tool_definitions`: docs/agents.md) and the
reference's own names in `extra` (`reference_tool_calls`, `reference_step_count`).
"""

from grpcgrade.hookspecs import hookimpl

from .code import CodeStyleGrader, PatchSimilarityGrader, SyntaxCheckGrader
from .math_expression import MathExpressionVerifyGrader
from .steps import ActionLoopDetectionGrader, ObservationInformationGainGrader, TrajectoryStepEfficiencyGrader
from .tool_call_valid import ToolCallValidGrader
from .tool_calls import ToolCallSequenceGrader, ToolCallSequenceSimpleGrader, ToolUsageEfficiencyGrader


@hookimpl
def register_graders(register):
    register(ToolCallSequenceSimpleGrader, name="tool_call_sequence_simple")
    register(ToolCallSequenceGrader, name="tool_call_sequence")
    register(ToolUsageEfficiencyGrader, name="tool_usage_efficiency")
    register(ActionLoopDetectionGrader, name="action_loop_detection")
    register(ObservationInformationGainGrader, name="observation_information_gain")
    register(TrajectoryStepEfficiencyGrader, name="trajectory_step_efficiency")
    register(SyntaxCheckGrader, name="syntax_check")
    register(CodeStyleGrader, name="code_style")
    register(PatchSimilarityGrader, name="patch_similarity")
    register(MathExpressionVerifyGrader, name="math_expression_verify")
    register(ToolCallValidGrader, name="tool_call_valid")
