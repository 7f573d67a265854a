"""The formula language of a `multi` grader's `calculate_output`, parsed and evaluated without `eval`.

OpenAI's grammar: numbers, the sub-graders' keys as variables, `+ - * / ^` (`^` is power, right-associative
and tighter than unary minus, so `-2^2` is -4), parentheses, and the functions `min max abs floor ceil exp
sqrt log` (`log` is the natural logarithm; `min` and `max` take one or more arguments).

A request writes the formula, so everything about it is bounded: its length, its nesting depth (checked
while parsing, so a deep formula is an error, not a RecursionError), and its arithmetic (floats only, so
`9^9^9^9` overflows at once instead of building a huge integer). The parser turns the formula into
postfix code that a loop evaluates with a stack: evaluation never recurses, whatever the formula's shape.
A result that is not a finite number (division by zero, `sqrt(-1)`, `exp(1000)`) raises FormulaError.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

MAX_FORMULA_CHARS = 4096
MAX_DEPTH = 200  # grammar levels: each pair of parentheses takes four

_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|([A-Za-z_][A-Za-z0-9_]*)|(.))")
_BINARY: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "^": math.pow,
}
_UNARY: dict[str, Callable[[float], float]] = {
    "abs": abs,
    "floor": lambda x: float(math.floor(x)),
    "ceil": lambda x: float(math.ceil(x)),
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
_VARIADIC: dict[str, Callable[..., float]] = {"min": min, "max": max}
FUNCTIONS = frozenset(_UNARY) | frozenset(_VARIADIC)


class FormulaError(ValueError):
    """The formula does not parse, names an unknown variable, or cannot be computed for these values."""


class UnknownVariable(FormulaError):
    """The formula names a variable that is not one of the sub-graders' keys."""


# Postfix instructions: ("num", value) | ("var", name) | ("bin", op) | ("neg", None) | ("call", (name, argc))
Instruction = tuple[str, object]


@dataclass(frozen=True)
class Formula:
    """A parsed formula: its text, the variables it reads, and postfix code."""

    text: str
    variables: frozenset[str]
    code: tuple[Instruction, ...]

    def evaluate(self, values: Mapping[str, float]) -> float:
        stack: list[float] = []
        try:
            for kind, arg in self.code:
                if kind == "num":
                    stack.append(arg)  # type: ignore[arg-type]
                elif kind == "var":
                    stack.append(float(values[arg]))  # type: ignore[index]
                elif kind == "neg":
                    stack.append(-stack.pop())
                elif kind == "bin":
                    right = stack.pop()
                    stack.append(_BINARY[arg](stack.pop(), right))  # type: ignore[index]
                else:
                    name, argc = cast(tuple[str, int], arg)
                    args = stack[len(stack) - argc :]
                    del stack[len(stack) - argc :]
                    stack.append(_UNARY[name](args[0]) if name in _UNARY else _VARIADIC[name](args))
        except ZeroDivisionError:
            raise FormulaError(f"{self.text!r}: division by zero") from None
        except OverflowError:
            raise FormulaError(f"{self.text!r}: a value is too large") from None
        except ValueError as exc:  # math domain errors: sqrt(-1), log(0), (-8)^(1/3)
            raise FormulaError(f"{self.text!r}: {exc}") from None
        (result,) = stack
        if not math.isfinite(result):
            raise FormulaError(f"{self.text!r}: the result is not a finite number ({result})")
        return result


def parse(text: str, variables: frozenset[str] | set[str]) -> Formula:
    """Parse `text`; raises FormulaError (UnknownVariable for a name that is neither a key nor a function)."""
    if not isinstance(text, str) or not text.strip():
        raise FormulaError("the formula is empty")
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaError(f"the formula has {len(text)} characters, over the limit of {MAX_FORMULA_CHARS}")
    return _Parser(text, frozenset(variables)).parse()


class _Parser:
    """Recursive descent over: sum := product (('+'|'-') product)*; product := unary (('*'|'/') unary)*;
    unary := ('-'|'+') unary | power; power := atom ('^' unary)?; atom := number | name | name '(' args ')' |
    '(' sum ')'. Every rule entered counts towards the depth limit."""

    def __init__(self, text: str, known: frozenset[str]) -> None:
        self.text = text
        self.known = known
        self.tokens = self._tokenize(text)
        self.pos = 0
        self.depth = 0
        self.code: list[Instruction] = []
        self.used: set[str] = set()

    @staticmethod
    def _tokenize(text: str) -> list[tuple[str, str]]:
        tokens = []
        for number, name, other in _TOKEN.findall(text.rstrip()):
            if number:
                tokens.append(("num", number))
            elif name:
                tokens.append(("name", name))
            elif other in "+-*/^(),":
                tokens.append(("op", other))
            else:
                raise FormulaError(f"unexpected character {other!r} in the formula")
        return tokens

    def parse(self) -> Formula:
        self._sum()
        if self.pos != len(self.tokens):
            raise FormulaError(f"unexpected {self.tokens[self.pos][1]!r} in the formula")
        return Formula(self.text, frozenset(self.used), tuple(self.code))

    def _peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def _take(self, expected: str) -> None:
        if self._peek() != expected:
            found = "the end" if self._peek() is None else repr(self._peek())
            raise FormulaError(f"expected {expected!r} in the formula, found {found}")
        self.pos += 1

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FormulaError(f"the formula is nested more than {MAX_DEPTH} levels deep")

    def _sum(self) -> None:
        self._left_associative(("+", "-"), self._product)

    def _product(self) -> None:
        self._left_associative(("*", "/"), self._unary)

    def _left_associative(self, operators: tuple[str, ...], operand: Callable[[], None]) -> None:
        self._enter()
        operand()
        while self._peek() in operators:
            op = self.tokens[self.pos][1]
            self.pos += 1
            operand()
            self.code.append(("bin", op))
        self.depth -= 1

    def _unary(self) -> None:
        self._enter()
        op = self._peek()
        if op in ("-", "+"):
            self.pos += 1
            self._unary()
            if op == "-":
                self.code.append(("neg", None))
        else:
            self._power()
        self.depth -= 1

    def _power(self) -> None:
        self._enter()
        self._atom()
        if self._peek() == "^":
            self.pos += 1
            self._unary()  # right-associative: 2^3^2 = 2^(3^2); 2^-1 is allowed
            self.code.append(("bin", "^"))
        self.depth -= 1

    def _atom(self) -> None:
        if self.pos >= len(self.tokens):
            raise FormulaError("the formula ends where a value was expected")
        kind, value = self.tokens[self.pos]
        self.pos += 1
        if kind == "num":
            number = float(value)
            if not math.isfinite(number):
                raise FormulaError(f"the number {value} is too large")
            self.code.append(("num", number))
        elif kind == "name" and self._peek() == "(":
            self._call(value)
        elif kind == "name":
            if value not in self.known:
                hint = f" (it is a function: write {value}(...))" if value in FUNCTIONS else ""
                raise UnknownVariable(f"unknown variable {value!r} in the formula{hint}; the sub-graders are: "
                                      f"{', '.join(sorted(self.known)) or 'none'}")  # fmt: skip
            self.used.add(value)
            self.code.append(("var", value))
        elif value == "(":
            self._sum()
            self._take(")")
        else:
            raise FormulaError(f"unexpected {value!r} in the formula")

    def _call(self, name: str) -> None:
        if name not in FUNCTIONS:
            raise FormulaError(f"unknown function {name!r} in the formula; functions: {', '.join(sorted(FUNCTIONS))}")
        self._take("(")
        argc = 0
        if self._peek() != ")":
            self._sum()
            argc = 1
            while self._peek() == ",":
                self.pos += 1
                self._sum()
                argc += 1
        self._take(")")
        if name in _UNARY and argc != 1:
            raise FormulaError(f"{name}() takes one argument, got {argc}")
        if argc == 0:
            raise FormulaError(f"{name}() takes at least one argument")
        self.code.append(("call", (name, argc)))
