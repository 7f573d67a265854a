"""Plugins as they really arrive: pip-installed packages with entry points (the `plugin_site` fixture installs
tests/plugins/*), loaded by `grpcgrade` subprocesses and by the suite's real server.

The datasette-style meta-tests at the end keep this file and docs/hooks.md in step with grpcgrade.hookspecs:
every hook needs a `test_hook_<name>` here and a heading on the hooks page with its exact signature.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import grpc
import pytest

from grpcgrade import hookspecs
from grpcgrade.client import GradingClient
from grpcgrade.core.plugins import DEFAULT_PLUGINS
from grpcgrade.testing import face_pids, start_server, worker_pids
from grpcgrade.v1 import grading_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
TEST_PLUGINS = Path(__file__).resolve().parent / "plugins"
BUILTINS = set(DEFAULT_PLUGINS)
PLUGIN_ENV_VARS = ("GRPCGRADE_LOAD_PLUGINS", "GRPCGRADE_TRACE_PLUGINS")


def project(dist: str) -> dict[str, Any]:
    """A test plugin's own metadata, the reference for what the service must report about it."""
    return tomllib.loads((TEST_PLUGINS / dist / "pyproject.toml").read_text())["project"]


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV_VARS}
    run = subprocess.run(
        [sys.executable, "-m", "grpcgrade.cli", *args], env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return run


def listing(plugin_env: dict[str, str], **env: str) -> dict[str, Any]:
    return json.loads(run_cli("graders", "--json", env={**plugin_env, **env}).stdout)


# -- GRPCGRADE_LOAD_PLUGINS, against real installed plugins ------------------------------------------------


@pytest.mark.parametrize(
    ("allow", "third_party"),
    [
        ("testplugin", {"testplugin"}),  # by entry-point name: broken is not even imported
        (" grpcgrade-testplugin , raising", {"testplugin", "raising"}),  # by distribution name, spaces ignored
        ("", set()),  # empty: no third-party plugin at all
    ],
)
def test_load_plugins_allow_list(plugin_env: dict[str, str], allow: str, third_party: set[str]) -> None:
    data = listing(plugin_env, GRPCGRADE_LOAD_PLUGINS=allow)
    plugins = {p["name"]: p for p in data["plugins"]}
    assert set(plugins) == BUILTINS | third_party  # excludes the dev venv's plugins/* packages too
    for name in BUILTINS:
        assert (plugins[name]["status"], plugins[name]["distribution"]) == ("loaded", "grpcgrade")
        assert plugins[name]["graders"]
    by_plugin = {g["name"]: g["plugin"] for g in data["graders"]}
    assert ("shout" in by_plugin) == ("testplugin" in third_party)
    assert "alphabetical" not in by_plugin


def test_without_the_allow_list_every_installed_plugin_is_tried(plugin_env: dict[str, str]) -> None:
    plugins = {p["name"]: p for p in listing(plugin_env)["plugins"]}
    for dist in ("grpcgrade-testplugin", "grpcgrade-broken", "grpcgrade-raising", "grpcgrade-clashing"):
        (entry_point,) = project(dist)["entry-points"]["grpcgrade"]
        assert plugins[entry_point]["version"] == project(dist)["version"]
    assert [plugins[n]["status"] for n in ("testplugin", "broken", "raising", "clashing")] == [
        "loaded",
        "failed",
        "failed",
        "clashed",
    ]


def test_trace_plugins_prints_every_hook_call(plugin_env: dict[str, str]) -> None:
    env = {**plugin_env, "GRPCGRADE_LOAD_PLUGINS": "testplugin", "GRPCGRADE_TRACE_PLUGINS": "1"}
    traced = run_cli("graders", "--json", env=env).stderr.splitlines()
    calls = [line for line in traced if line.strip() == "register_graders [hook]"]  # pluggy's trace format
    assert len(calls) == len(BUILTINS) + 1
    assert not run_cli("graders", "--json", env={**plugin_env, "GRPCGRADE_LOAD_PLUGINS": "testplugin"}).stderr


# -- `grpcgrade graders` -----------------------------------------------------------------------------------


def test_graders_text_names_plugin_and_version_and_failures(plugin_env: dict[str, str]) -> None:
    lines = run_cli("graders", env=plugin_env).stdout.splitlines()
    version = project("grpcgrade-testplugin")["version"]
    for name in ("shout", "count_word", "longest_first"):
        assert any(
            line.startswith(name) and f"plugin testplugin, grpcgrade-testplugin {version}" in line for line in lines
        ), name
    assert any(line.startswith("string_match") and "plugin text, grpcgrade " in line for line in lines)
    with pytest.raises(ModuleNotFoundError) as missing:  # what grpcgrade_broken's import really raises
        importlib.import_module("grpcgrade_dependency_that_does_not_exist")
    broken = project("grpcgrade-broken")["version"]
    assert f"  broken  grpcgrade-broken {broken}  failed: ModuleNotFoundError: {missing.value}" in lines
    raising = project("grpcgrade-raising")["version"]
    assert f"  raising  grpcgrade-raising {raising}  failed: RuntimeError: grpcgrade-raising fails on purpose" in lines


# -- isolation and name clashes, in the suite's real server ------------------------------------------------


def test_a_plugin_raising_in_register_graders_is_isolated(client: GradingClient) -> None:
    plugins = {p.name: p for p in client.list_graders().plugins}
    raising = plugins["raising"]
    assert (raising.status, raising.error, list(raising.graders)) == (
        "failed",
        "RuntimeError: grpcgrade-raising fails on purpose",
        [],
    )
    assert plugins["testplugin"].status == "loaded"  # the plugins around it register as usual
    (result,) = client.evaluate({"response": "HI", "reference": "hi"}, ["shout"]).results
    assert result.score == 1.0
    # What it registered before it failed is not served either (it was, while listed as failed).
    assert "registered_first" not in {g.name for g in client.list_graders().graders}
    with pytest.raises(grpc.RpcError) as unknown:
        client.evaluate({"response": "x"}, ["registered_first"])
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_taken_name_keeps_the_first_and_reports_the_clash(client: GradingClient) -> None:
    reply = client.list_graders()
    string_match = next(g for g in reply.graders if g.name == "string_match")
    assert (string_match.plugin, string_match.distribution) == ("text", "grpcgrade")  # built-ins load first
    clashing = next(p for p in reply.plugins if p.name == "clashing")
    assert clashing.status == "clashed"  # its other grader is served, the status says one name was lost
    assert list(clashing.graders) == ["alphabetical"]
    assert clashing.error == "grader name 'string_match' is already registered by plugin 'text'"
    (result,) = client.evaluate({"response": "same", "reference": "same"}, ["string_match"]).results
    assert result.score == 1.0  # the built-in's exact match, not the impostor's -1


# -- hooks: each one exercised through a real plugin ------------------------------------------------------


def test_hook_register_graders(client: GradingClient) -> None:
    """register(factory, *, name, aliases, description, mode), as grpcgrade-clashing calls it."""
    reply = client.list_graders()
    grader = next(g for g in reply.graders if g.name == "alphabetical")
    meta = project("grpcgrade-clashing")
    assert (grader.plugin, grader.distribution, grader.version) == ("clashing", meta["name"], meta["version"])
    assert list(grader.aliases) == ["abc_order"]
    assert grader.description == "Ranks responses in alphabetical order."
    assert grader.mode == pb.GRADER_MODE_LISTWISE
    (result,) = client.evaluate({"responses": ["pear", "apple", "fig"]}, ["abc_order"]).results
    assert (result.grader, list(result.rank)) == ("alphabetical", [3, 1, 2])


def test_function_graders_from_partials_callable_objects_and_real_numbers(client: GradingClient) -> None:
    """What grader authors naturally register: a `functools.partial` (`count_rpc`), a callable object with an
    async `__call__` (`overlap`), a function returning numpy's float32 or a Fraction (`typed_length`). Before,
    the first two failed to build (no `__name__`), so every call naming them ended UNKNOWN, and the numbers
    were GRADER_FAILED, though the same numbers from a class grader are scores."""
    import numpy

    listing = {g.name: g for g in client.list_graders().graders}
    assert listing["count_rpc"].description == "How many times `word` appears."
    assert listing["overlap"].description.startswith("The share of the reference's words found in the response")
    graders = [
        "count_rpc",
        "overlap",
        "typed_length",
        {"name": "typed_length", "key": "fraction", "params": {"kind": "fraction"}},
    ]
    samples = [{"response": "grpc rpc rpc ", "reference": "rpc call"}, {"response": "no", "reference": "x y z w"}]
    expected = [[2.0, 0.5, float(numpy.float32(13 / 8)), 13 / 8], [0.0, 0.0, float(numpy.float32(2 / 8)), 2 / 8]]
    for view in (pb.RESULT_VIEW_FULL, pb.RESULT_VIEW_SCORES):
        replies = client.batch_evaluate(samples, graders, view=view)
        assert [[r.error.code for r in reply.results] for reply in replies] == [[""] * 4] * 2
        assert [[r.score for r in reply.results] for reply in replies] == expected
    unary = client.evaluate(samples[0], graders)
    assert [r.score for r in unary.results] == expected[0] and unary.HasField("reward")


def test_a_function_graders_score_and_reason_pair_is_checked_as_a_number_is(client: GradingClient) -> None:
    """A `(score, reason)` pair's score goes to the result check a bare number goes to. Before, it was
    `float(score)`, so a score sent as text ("1.625") was a score, and an int no double holds was
    GRADER_FAILED; a reason None was the reason "None"."""
    graders = [{"name": "typed_length", "key": kind, "params": {"kind": kind}} for kind in PAIR_KINDS]
    sample = {"response": "grpc rpc rpc "}
    for view in (pb.RESULT_VIEW_FULL, pb.RESULT_VIEW_SCORES):
        (reply,) = client.batch_evaluate([sample], graders, view=view)
        pair, text, huge = reply.results
        assert (pair.score, pair.error.code) == (13 / 8, "")
        assert (text.error.code, huge.error.code) == ("INVALID_RESULT", "INVALID_RESULT")
        assert not reply.HasField("reward")
    pair, text, huge = client.evaluate(sample, graders).results
    assert pair.reason == "" and "a score of type str, not a number" in text.error.message
    assert "non-finite score" in huge.error.message


PAIR_KINDS = ("pair", "text_pair", "huge_pair")


# -- warming graders up (`BaseGrader.warm_up`): in the processes that grade, before they take work -----------


def test_loading_the_registry_starts_no_thread(plugin_env: dict[str, str]) -> None:
    """`grpcgrade graders`, a face process, a client's test: loading the plugins starts no work of its own.
    A plugin that once warmed jieba in a daemon thread as it registered made every such process load a
    73 MB dictionary, and raced the interpreter's exit: jieba's import builds a logging handler, and one
    half-built as the process exited made logging.shutdown print a traceback."""
    code = (
        "import threading; from grpcgrade.core.registry import get_registry; get_registry(); "
        "print([t.name for t in threading.enumerate()])"
    )
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, **plugin_env}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['MainThread']"


def test_a_server_without_workers_warms_its_graders_before_serving(tmp_path: Path, plugin_env: dict[str, str]):
    """It grades every grader itself then (the warm-up's promise: no request pays a cold start)."""
    record = tmp_path / "warmed"
    server = start_server(tmp_path, "--workers", "0", env={**plugin_env, "GRPCGRADE_TEST_WARMED": str(record)})
    try:
        pids = [int(line) for line in record.read_text().split()]
    finally:
        server.stop()
    assert pids == [server.proc.pid]


def test_with_workers_only_the_workers_warm_up(tmp_path: Path, plugin_env: dict[str, str]) -> None:
    """The server's process grades only cheap graders inline then, and face processes grade nothing."""
    record = tmp_path / "warmed"
    env = {**plugin_env, "GRPCGRADE_TEST_WARMED": str(record)}
    server = start_server(tmp_path, "--workers", "2", "--http-processes", "2", env=env, http=True)
    try:
        workers, faces = worker_pids(server.proc.pid), face_pids(server.proc.pid)
        pids = [int(line) for line in record.read_text().split()]
    finally:
        server.stop()
    assert len(workers) == 2 and len(faces) == 2
    assert sorted(pids) == sorted(workers)


# -- meta-tests ------------------------------------------------------------------------------------------


def hook_names() -> list[str]:
    marker = f"{hookspecs.hookspec.project_name}_spec"  # the attribute pluggy's HookspecMarker sets
    return sorted(name for name, obj in vars(hookspecs).items() if callable(obj) and hasattr(obj, marker))


def test_hookspecs_are_found() -> None:
    assert "register_graders" in hook_names()


@pytest.mark.parametrize("hook", hook_names())
def test_plugin_hooks_have_tests(hook: str) -> None:
    assert f"test_hook_{hook}" in globals(), f"add test_hook_{hook} to {Path(__file__).name}"


@pytest.mark.parametrize("hook", hook_names())
def test_plugin_hooks_are_documented(hook: str) -> None:
    signature = f"{hook}{inspect.signature(getattr(hookspecs, hook))}"
    page = ROOT / "docs" / "hooks.md"
    assert page.exists(), "docs/hooks.md is missing"
    headings = [line for line in page.read_text().splitlines() if line.startswith("#")]
    assert any(signature in heading for heading in headings), f"docs/hooks.md has no heading with {signature}"
