"""LLM judges: graders whose judgment comes from a chat model behind an OpenAI-compatible endpoint.

Write one as the seeds do (module docstring, English prompt, Chinese prompt, `PromptTemplate`, an
`LLMGrader` subclass); point it at a model the server's `models:` configuration names.
"""

from .grader import LLMGrader
from .models import configure
from .parsing import JudgeOutputError
from .prompt import ChatMessage, LanguageEnum, PromptTemplate
from .settings import DEFAULT_MODEL, ModelConfig, parse_models

__all__ = [
    "DEFAULT_MODEL",
    "ChatMessage",
    "JudgeOutputError",
    "LLMGrader",
    "LanguageEnum",
    "ModelConfig",
    "PromptTemplate",
    "configure",
    "parse_models",
]
