"""The manual is tested like code: its generated parts are current and its Python examples run.

* Pages with cog blocks (CLI help, the graders table, the configuration reference) must equal what
  `scripts/docgen.py` prints now: `cog --check` fails on a stale page (`make cog` rewrites them).
* Every ```yaml block that is a server configuration (it has `rewards:`, `limits:` or `models:`) is read
  and its rewards resolved against the installed graders, as `grpcgrade serve --config` does at start.
* Every ```python block of README.md and docs/*.md runs, page by page in one namespace (a page reads as one
  session), against a real server started here with the configuration example of docs/configuration.md
  and a judge model (a loopback HTTP service that always gives the top score) for the LLM judges page.
  The pages say `127.0.0.1:50051`, the address `make serve` uses; this server listens on a free port, so
  the address is swapped in. A block whose first line is `# not run: <why>` (needs an LLM endpoint, a
  reader's own data...) is only compiled; the comment is shown on the page, so readers see it too. A page
  whose examples need a server of their own (other rewards, the HTTP face) has its own test, named in
  TESTED_ELSEWHERE; here its blocks are only compiled.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from http_services import Reply, http_service

from grpcgrade.testing import start_server

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
DOCS_ADDRESS = "127.0.0.1:50051"
NOT_RUN = "# not run:"
#: Pages whose examples their own tests run (against the server they need), with those tests.
TESTED_ELSEWHERE = {
    "openai-graders.md": ("tests/test_openai_graders.py", "tests/test_openai_http.py"),
    "trainers.md": ("tests/test_docs_trainers.py",),
}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(page: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text()) if lang == language]


def cog_pages() -> list[Path]:
    return [p for p in PAGES if "[[[cog" in p.read_text()]


def test_cog_pages_are_found() -> None:
    names = {p.name for p in cog_pages()}
    assert {"cli.md", "graders.md", "configuration.md"} <= names


def test_generated_parts_are_current() -> None:
    cmd = [sys.executable, "-m", "cogapp", "--check", "-I", str(ROOT / "scripts"), *map(str, cog_pages())]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"stale generated docs; run `make cog`:\n{proc.stdout}{proc.stderr}"


def test_cog_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text((DOCS / "cli.md").read_text().replace("run the gRPC server", "run the server", 1))
    cmd = [sys.executable, "-m", "cogapp", "--check", "-I", str(ROOT / "scripts"), str(stale)]
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode != 0


def judge_reply(number: int, body: dict) -> Reply:
    """A judge model on loopback for the LLM judges page: it answers every prompt with the top score."""
    content = json.dumps({"score": 5, "reason": "The response names the capital."})
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    return 200, {"id": f"docs-{number}", "object": "chat.completion", "choices": [choice]}, {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("docs-server")
    config = (ROOT / "examples" / "rewards.yaml").read_text()  # the ready config the README serves
    with http_service(judge_reply) as judge:
        base_url = judge.url.rsplit("/", 1)[0] + "/v1"
        (workdir / "grpcgrade.yaml").write_text(f"{config}models:\n  gpt-4o-mini: {{base_url: '{base_url}'}}\n")
        srv = start_server(workdir, "--workers", "1", "--config", "grpcgrade.yaml", metrics=False)
        yield srv
        srv.stop()


def python_pages() -> list[Path]:
    return [p for p in PAGES if blocks(p, "python")]


@pytest.mark.parametrize("page", python_pages(), ids=lambda p: p.name)
def test_python_examples_run(page: Path, server) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for i, body in enumerate(blocks(page, "python")):
        where = f"{page.name}, python block {i + 1}"
        code = compile(body.replace(DOCS_ADDRESS, server.target), where, "exec")
        if not body.startswith(NOT_RUN) and page.name not in TESTED_ELSEWHERE:
            exec(code, namespace)


@pytest.mark.parametrize("page", sorted(TESTED_ELSEWHERE))
def test_pages_tested_elsewhere_are_run_by_their_tests(page: str) -> None:
    for test in TESTED_ELSEWHERE[page]:
        assert page in (ROOT / test).read_text(), f"{test} does not run the examples of {page}"


def test_not_run_blocks_say_why() -> None:
    for page in PAGES:
        for body in blocks(page, "python"):
            if NOT_RUN in body.splitlines()[0]:
                assert len(body.splitlines()[0]) > len(NOT_RUN) + 3, f"{page.name}: say why a block is not run"


CONFIG_KEYS = ("rewards:", "limits:", "models:")
CHECK_CONFIG = """
import sys, yaml
from grpcgrade.core.config import parse_config
from grpcgrade.core.engine import Engine
from grpcgrade.core.registry import get_registry
from grpcgrade.llm.models import configure
config = parse_config(yaml.safe_load(sys.stdin.read()), sys.argv[1])
configure(config.models)
engine = Engine(get_registry(), None, rewards=config.rewards)
for reward in config.rewards.values():
    engine.resolve(reward.specs)
"""


def config_blocks() -> list[tuple[str, str]]:
    return [
        (f"{page.name}, yaml block {i + 1}", body)
        for page in PAGES
        for i, body in enumerate(blocks(page, "yaml"))
        if any(line.startswith(CONFIG_KEYS) for line in body.splitlines())
    ]


@pytest.mark.parametrize(("where", "body"), config_blocks(), ids=[w for w, _ in config_blocks()])
def test_configuration_examples_load(where: str, body: str) -> None:
    env = {**os.environ, "JUDGE_API_KEY": "sk-docs", "OPENAI_API_KEY": "sk-docs"}  # the keys they name
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_CONFIG, where], input=body, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"{where}: {proc.stderr[-2000:]}"


def test_readme_links_resolve() -> None:
    """The site build checks the pages' links; the README is outside it, so its links are checked here."""
    targets = re.findall(r"\]\(([^)#\s]+)[^)]*\)", (ROOT / "README.md").read_text())
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
