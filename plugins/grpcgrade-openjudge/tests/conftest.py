"""The project's test helpers (tests/openai_judge.py, tests/http_services.py) on the path; every test here
needs py-openjudge (`make test-openjudge` builds its environment) and carries the `openjudge` marker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.openjudge)
