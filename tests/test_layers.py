"""The layers stay visible: the core (and the built-in graders it loads) never imports grpc or protobuf, so
workers, graders and in-process users do not pay for them, and the service stays the only translator; and
no modules import one another (data flows one way)."""

import ast
import json
import pkgutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeGuard

import grpcgrade
import grpcgrade.core


def _loaded_after(code: str) -> set[str]:
    script = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_core_and_the_built_in_graders_load_without_grpc_or_protobuf() -> None:
    core = [m.name for m in pkgutil.iter_modules(grpcgrade.core.__path__, "grpcgrade.core.")]
    assert "grpcgrade.core.engine" in core and "grpcgrade.core.registry" in core
    imports = "\n".join(f"import {name}" for name in core)
    # Building the registry imports every built-in grader family, as a worker process does.
    loaded = _loaded_after(f"{imports}\nfrom grpcgrade.core.registry import get_registry\nget_registry()")
    assert "grpcgrade.graders.text" in loaded and "grpcgrade.graders.kolibrify" in loaded
    assert not {m for m in loaded if m == "grpc" or m.startswith(("grpc.", "google.protobuf"))}


def test_the_service_layer_does_load_grpc() -> None:
    """The check above can fail: the same probe sees grpc where it is imported."""
    assert "grpc" in _loaded_after("import grpcgrade.service.servicer")


# Data flows one way: no module imports, at any depth, a module that imports it back. Every import counts
# (a function-level import is as real a dependency as a module-level one, only later), except one under
# `if TYPE_CHECKING:`, which never runs.
PACKAGE = Path(grpcgrade.__file__).resolve().parent
#: Cycles in flight elsewhere, each named with who removes it. Empty once they are gone.
ALLOWED_CYCLES: set[frozenset[str]] = set()


def _modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every module of the package at `root`."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> TypeGuard[ast.If]:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, modules: Mapping[str, Path]) -> dict[str, int]:
    """What module `name` imports (anywhere but under TYPE_CHECKING) -> the first line doing so. A module of
    the package is named as the module (`from pkg import x` is `pkg.x` when that is a module, else `pkg`;
    `import a.b` of a name inside a module is that module); another package's as written."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: list[tuple[str, int]] = []

    def visit(nodes: Iterable[ast.AST]) -> None:
        for node in nodes:
            if _type_checking(node):
                visit(node.orelse)  # the `else:` of `if TYPE_CHECKING:` runs
            elif isinstance(node, ast.Import):
                targets.extend((alias.name, node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                targets.extend(
                    (f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, node.lineno) for a in node.names
                )
            else:
                visit(ast.iter_child_nodes(node))

    visit(ast.parse(path.read_text(), str(path)).body)
    edges: dict[str, int] = {}
    for target, line in targets:
        known = target
        while known and known not in modules:
            known = known.rpartition(".")[0]
        if known != name:
            edges.setdefault(known or target, line)
    return edges


def import_cycles(root: Path) -> list[list[str]]:
    """Each set of modules that import one another (a strongly connected component larger than one module,
    Tarjan's algorithm), with the import lines that close it."""
    modules = _modules(root)
    graph = {
        name: {t: line for t, line in _imports(name, path, modules).items() if t in modules}
        for name, path in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                members = set(component)
                cycles.append(
                    sorted(f"{m}:{line} imports {t}" for m in members for t, line in graph[m].items() if t in members)
                )

    for v in graph:
        if v not in index:
            strong(v)
    return cycles


def _members(cycle: list[str]) -> frozenset[str]:
    return frozenset(edge.split(":")[0] for edge in cycle)


def test_no_import_cycles() -> None:
    cycles = [c for c in import_cycles(PACKAGE) if _members(c) not in ALLOWED_CYCLES]
    assert not cycles, "import cycles:\n" + "\n\n".join("\n".join(c) for c in cycles)


def test_the_cycle_check_sees_function_level_imports_and_ignores_type_checking_ones(tmp_path: Path) -> None:
    """The check above can fail: a cycle closed by an import inside a function is found, one closed only
    under TYPE_CHECKING is not, and relative imports resolve."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (pkg / "c.py").write_text("from pkg import d\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    assert [_members(c) for c in import_cycles(pkg)] == [frozenset({"pkg.a", "pkg.sub.b"})]


#: What the core and the built-in graders never import, even inside a function: the service's wire (grpc,
#: protobuf, the generated stubs) and what is built on it.
WIRE = ("grpc", "google.protobuf", "grpcgrade.v1", "grpcgrade.service", "grpcgrade.client", "grpcgrade.integrations")


def test_the_core_and_the_graders_import_nothing_of_the_wire_anywhere() -> None:
    """The probe above sees what importing the core loads; this sees imports it does not run (inside a
    function, on a path the probe does not take)."""
    modules = _modules(PACKAGE)
    wrong = [
        f"{name}:{line} imports {target}"
        for name, path in modules.items()
        if name.startswith(("grpcgrade.core", "grpcgrade.graders"))
        for target, line in _imports(name, path, modules).items()
        if target.startswith(tuple(f"{w}." for w in WIRE)) or target in WIRE
    ]
    assert not wrong, "\n".join(wrong)


def _imported(tree: ast.AST) -> Iterable[str]:
    """Every module name an `import` or `from ... import` of `tree` names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_no_test_module_imports_another() -> None:
    """What several test modules share lives in helper modules beside them, and fixtures in conftest.py:
    a test module that imports another ties itself to the other's insides, and what it imports of it (a
    fixture, a test) is collected in it again."""
    tests = Path(__file__).resolve().parent
    offenders = sorted(
        f"{path.relative_to(tests)} imports {name}"
        for path in tests.rglob("*.py")
        for name in _imported(ast.parse(path.read_text()))
        if name.split(".")[0].startswith("test_")
    )
    assert offenders == []
