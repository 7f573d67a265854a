"""`grpcgrade new-plugin NAME`: a plugin package that installs, serves and passes its own test as written.

A grader author should start from code that already runs end to end (entry point, registration, a test
through a real server) and only change the grading logic. The layout is the one of
plugins/grpcgrade-example, cut down to a single grader.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from string import Template


@dataclass(frozen=True)
class PluginNames:
    name: str  # entry-point name, plugin name and grader name: `my_grader`
    dist: str  # distribution and directory: `grpcgrade-my-grader`
    module: str  # `grpcgrade_my_grader`
    cls: str  # `MyGrader`


def plugin_names(name: str) -> PluginNames:
    """Every name derives from one, so the entry point, module and directory can never disagree."""
    short = re.sub(r"^grpcgrade[-_]", "", name.strip().lower()).replace("-", "_")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", short):
        raise ValueError(f"plugin name {name!r}: use letters, digits, '-' or '_', starting with a letter")
    return PluginNames(
        name=short,
        dist="grpcgrade-" + short.replace("_", "-"),
        module="grpcgrade_" + short,
        cls="".join(part.capitalize() for part in short.split("_") if part),
    )


PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "grpcgrade plugin: the $name grader"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["grpcgrade[server]"]  # the grader API (pluggy) and the server that loads it

[project.optional-dependencies]
test = ["pytest"]

[project.entry-points.grpcgrade]
$name = "$module"

[tool.setuptools]
py-modules = ["$module"]
"""

MODULE = '''\
"""grpcgrade plugin `$name`."""

from collections.abc import Callable

from grpcgrade import BaseGrader, GraderScore, hookimpl


# Replace the grading logic; keep the docstring's first line: it is the grader's description.
class $cls(BaseGrader):
    """1.0 when the response contains the reference, else 0.0."""

    def __init__(self, ignore_case: bool = True) -> None:  # constructor params are the grader's params
        super().__init__()
        self.ignore_case = ignore_case

    def evaluate(self, response: str, reference: str) -> GraderScore:  # sample fields by name
        if self.ignore_case:
            response, reference = response.casefold(), reference.casefold()
        found = reference in response
        return GraderScore(self.name, float(found), "reference found" if found else "reference missing")


@hookimpl
def register_graders(register: Callable[..., None]) -> None:
    register($cls, name="$name")
'''

TEST = '''\
"""`$name` as a trainer meets it: installed, loaded by a real grpcgrade server, called over gRPC.

Install the package first (`pip install -e .`), then run `pytest`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from grpcgrade import GradingClient
from grpcgrade.testing import start_server


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GradingClient]:
    server = start_server(tmp_path_factory.mktemp("server"), "--workers", "0", metrics=False)
    try:
        with server.client(timeout=30) as c:
            yield c
    finally:
        server.stop()


def test_the_server_loads_the_plugin(client: GradingClient) -> None:
    plugins = {p.name: p for p in client.list_graders().plugins}
    assert "$name" in plugins, "the server did not find the plugin: is the package installed?"
    assert (plugins["$name"].status, plugins["$name"].error) == ("loaded", "")
    assert list(plugins["$name"].graders) == ["$name"]


def test_$name(client: GradingClient) -> None:
    sample = {"response": "The capital is Paris.", "reference": "paris"}
    (result,) = client.evaluate(sample, ["$name"]).results
    assert (result.score, result.reason) == (1.0, "reference found")
    (result,) = client.evaluate(sample, [{"name": "$name", "params": {"ignore_case": False}}]).results
    assert (result.score, result.reason) == (0.0, "reference missing")
'''

README = """\
# $dist

A grpcgrade plugin: the `$name` grader.

```sh
pip install -e .
grpcgrade graders   # lists $name, from plugin $name ($dist 0.1.0)
pytest              # runs it through a real server on a free loopback port
```

| grader | inputs | params | score |
|---|---|---|---|
| `$name` | `response`, `reference` | `ignore_case: bool = True` | 1.0 when the response contains the reference |
"""

FILES = {
    "pyproject.toml": PYPROJECT,
    "$module.py": MODULE,
    "README.md": README,
    "tests/test_$module.py": TEST,
}


def new_plugin(name: str, directory: Path) -> Path:
    """Write `grpcgrade-NAME/` under `directory` and return it; never overwrites an existing one."""
    names = asdict(plugin_names(name))
    root = Path(directory) / names["dist"]
    if root.exists():
        raise FileExistsError(f"{root} already exists")
    for relpath, template in FILES.items():
        path = root / Template(relpath).substitute(names)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(names))
    return root
