"""Python programs that call a function of the code under test inside the sandbox.

Both call-based test cases (`fn_name`) and OpenAI's `python` grader (`grade(sample, item)`) load a module
and call one of its functions with JSON arguments. The module's source travels inside the harness as a
Python literal, so the harness is one self-contained program any backend can run. The harness reads the
request from stdin before the module runs (so the module cannot consume it), runs the module under the
name `solution` (so its `if __name__ == "__main__":` block does not run, as veRL loads it), calls the
function, and writes the JSON of its return value as the last line of stdout. A return value JSON cannot
hold is the program's error, as in veRL. Nothing the module does can make another run pass: expected
values never enter the sandbox.
"""

from __future__ import annotations

import json
from typing import Any

#: veRL's prime_code and SandboxFusion scorers put these imports before a solution, which many APPS and
#: LeetCode solutions rely on (`List`, `defaultdict`, `heappush`... without importing them); prime_code
#: also raises the recursion limit.
VERL_PREAMBLE = """\
from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
import string
import re
import datetime
import collections
import heapq
import bisect
import copy
import math
import random
import statistics
import itertools
import functools
import operator
import io
import sys
import json
sys.setrecursionlimit(6*10**5)
"""

HARNESS = """
import json, sys
request = json.loads(sys.stdin.read())
code = compile(SOURCE, "solution.py", "exec")
namespace = {"__name__": "solution"}
exec(code, namespace)
name = request["function"]
function = namespace.get(name)
if function is None and request["solution_class"] and isinstance(namespace.get("Solution"), type):
    function = getattr(namespace["Solution"](), name, None)
if not callable(function):
    raise NameError(f"function {name!r} is not defined")
args = request["args"]
if request["int_keys"] and args and isinstance(args[0], dict):
    try:
        args[0] = {int(key): value for key, value in args[0].items()}
    except ValueError:
        pass
result = json.dumps(function(*args))
sys.stdout.write("\\n" + result + "\\n")
"""


def call_program(module_source: str) -> str:
    """The harness around a module's source: one Python program."""
    return f"SOURCE = {module_source!r}\n{HARNESS}"


def call_request(function: str, args: list[Any], solution_class: bool = True, int_keys: bool = True) -> str:
    """The harness's stdin for one call: which function, with which (JSON) arguments.

    `solution_class` looks the function up on `Solution()` when the module defines no such function
    (LeetCode style); `int_keys` turns the keys of a first argument that is a mapping back into integers
    where they all are (JSON made them strings), as veRL's prime_code does.
    """
    request = {"function": function, "args": args, "solution_class": solution_class, "int_keys": int_keys}
    return json.dumps(request)


def read_result(stdout: str) -> tuple[bool, Any]:
    """(True, value) from the harness's last line of stdout, or (False, None) when there is none."""
    lines = stdout.rstrip("\n").rsplit("\n", 1)
    try:
        return True, json.loads(lines[-1])
    except ValueError:
        return False, None
