"""docs/trainers.md, run: its Python blocks against a real server, its veRL command line loaded and called
the way veRL loads and calls a custom reward function, its OpenRLHF command line served and posted to the
way OpenRLHF posts."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import re
import shlex
import subprocess
from functools import partial
from pathlib import Path

import pytest
import yaml

from grpcgrade.testing import start_server

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "trainers.md"
DOC_TARGET = "127.0.0.1:50051"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)


def commands(block: str) -> list[list[str]]:
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_python_examples_run(server):
    namespace: dict = {}
    for code in blocks("python"):
        exec(compile(code.replace(DOC_TARGET, server.target), str(PAGE), "exec"), namespace)  # noqa: S102


def test_the_configuration_example_is_the_suites_reward(tmp_path):
    from grpcgrade.core.config import parse_config

    (example,) = blocks("yaml")
    doc = parse_config(yaml.safe_load(example))
    suite = parse_config(yaml.safe_load((ROOT / "tests" / "fixtures" / "server-config.yaml").read_text()))
    assert doc.default_reward == "gsm8k_text"
    assert doc.rewards["gsm8k_text"].specs == doc.rewards["gsm8k"].specs[:3]
    assert doc.rewards["gsm8k"].specs == suite.rewards["gsm8k"].specs  # the suite's server runs what the page shows


def load_extern_object(module_path: str, object_name: str):
    """veRL's verl/utils/import_utils.py: `pkg://` imports a module, anything else is a file."""
    if module_path.startswith("pkg://"):
        module = importlib.import_module(module_path[len("pkg://") :].replace("/", "."))
    else:
        spec = importlib.util.spec_from_file_location(f"custom_module_{hash(module_path)}", module_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return getattr(module, object_name)


async def _call_with_kwargs_async(raw_fn, extra_kwargs, *args, **kwargs):
    return await raw_fn(*args, **{**kwargs, **extra_kwargs})


def test_verl_command_line(server):
    (veRL,) = [b for b in blocks("bash") if "verl.trainer.main_ppo" in b]
    (argv,) = commands(veRL)
    overrides = dict(a.lstrip("+").split("=", 1) for a in argv if "=" in a)
    prefix = "reward.custom_reward_function."
    raw_fn = load_extern_object(overrides[prefix + "path"], overrides[prefix + "name"])
    kwargs_prefix = prefix + "reward_kwargs."
    reward_kwargs = {k[len(kwargs_prefix) :]: v for k, v in overrides.items() if k.startswith(kwargs_prefix)}
    reward_kwargs = {k: yaml.safe_load(v) for k, v in reward_kwargs.items()}  # Hydra types values as YAML does
    reward_kwargs["target"] = server.target
    assert inspect.iscoroutinefunction(raw_fn)
    fn = partial(_call_with_kwargs_async, raw_fn, reward_kwargs)

    async def step():
        good = "<think>\nr\n</think>\n72"
        # What veRL 0.9's naive reward manager passes (experimental/reward_loop/reward_manager/naive.py): the
        # dataset's extra_info plus num_turns and rollout_reward_scores; no token count.
        info = {"index": 0, "num_turns": None, "rollout_reward_scores": {}}
        return await asyncio.gather(fn(data_source="gsm8k", solution_str=good, ground_truth="#### 72", extra_info=info))

    (result,) = asyncio.run(step())
    assert result["score"] == 1.0 and result["grpcgrade/failed"] == 0.0

    # The file path the page tells older veRL versions to print works the same way.
    import grpcgrade.integrations.verl as module

    assert load_extern_object(module.__file__, "compute_score").__name__ == "compute_score"


def test_openrlhf_command_lines(tmp_path, plugin_env):
    import aiohttp

    (block,) = [b for b in blocks("bash") if "openrlhf" in b]
    serve, train = commands(block)
    assert serve[:2] == ["grpcgrade", "serve"]
    (config,) = blocks("yaml")
    (tmp_path / "rewards.yaml").write_text(config)
    (tmp_path / "tokens").write_text("TOKEN-from-the-test\n")
    args = serve[2:]
    del args[args.index("--http-port") : args.index("--http-port") + 2]  # the page's port: the one it is given
    srv = start_server(tmp_path, *args, "--workers", "0", env=plugin_env, http=True)
    port = srv.http_port
    try:
        url = train[train.index("--reward.remote_url") + 1]
        url = url.replace("TOKEN", "TOKEN-from-the-test").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        prompt = "<|im_start|>user\n8*9?<|im_end|>\n<|im_start|>assistant\n"
        payload = {"query": [prompt + "<think>\nr\n</think>\n72<|im_end|>"], "prompts": [prompt], "labels": ["#### 72"]}

        async def post():  # openrlhf/utils/agent.py, _fetch_rewards_via_http
            timeout = aiohttp.ClientTimeout(total=180)
            async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url, json=payload) as response:
                response.raise_for_status()
                return await response.json()

        reply = asyncio.run(post())
    finally:
        srv.stop()
    assert reply == {"rewards": [1.0], "scores": [1.0], "extra_logs": {"grpcgrade_failed": [0.0]}}


def titled(title: str) -> str:
    """The page's Python block titled `title` (run in that framework's own installation)."""
    (block,) = re.findall(rf'```python title="{title}"\n(.*?)```', PAGE.read_text(), flags=re.S)
    return block


def http_server(tmp_path: Path, plugin_env, *tokens: str):
    """A server of the page's configuration with its HTTP face; (server, port)."""
    (config,) = blocks("yaml")
    (tmp_path / "rewards.yaml").write_text(config)
    args = ["--config", "rewards.yaml", "--workers", "0"]
    if tokens:
        (tmp_path / "tokens").write_text("\n".join(tokens) + "\n")
        args += ["--auth-token-file", "tokens"]
    server = start_server(tmp_path, *args, env=plugin_env, http=True)
    return server, server.http_port


def test_slime_command_lines(tmp_path, plugin_env):
    import aiohttp

    (block,) = [b for b in blocks("bash") if "--rm-url" in b]
    serve, train = commands(block)
    assert serve[:2] == ["grpcgrade", "serve"] and train[train.index("--rm-type") + 1] == "remote_rm"
    srv, port = http_server(tmp_path, plugin_env, "TOKEN-from-the-test")
    try:
        url = train[train.index("--rm-url") + 1]
        url = url.replace("TOKEN", "TOKEN-from-the-test").replace("127.0.0.1:8000", f"127.0.0.1:{port}")

        async def remote_rm():  # slime/rollout/rm_hub/__init__.py
            connector = aiohttp.TCPConnector(limit=64)
            timeout = aiohttp.ClientTimeout(total=120)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                body = {"prompt": "What is 8*9?", "response": "<think>\nr\n</think>\n72", "label": "#### 72"}
                async with session.post(url, json=body) as resp:
                    resp.raise_for_status()
                    return await resp.json()

        assert asyncio.run(remote_rm()) == 1.0
    finally:
        srv.stop()


def _run_in(python: Path, code: str) -> None:
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.trainers
def test_framework_examples_run_in_their_frameworks(server, trainers_python):
    for title in ("skyrl", "areal", "verifiers"):
        _run_in(trainers_python, titled(title).replace(DOC_TARGET, server.target))


@pytest.mark.trainers
def test_nemo_gym_example_runs_with_nemo_gym(tmp_path, plugin_env, nemo_gym_python):
    srv, port = http_server(tmp_path, plugin_env)
    try:
        _run_in(nemo_gym_python, titled("nemo_gym").replace('"port": 8000', f'"port": {port}'))
    finally:
        srv.stop()
