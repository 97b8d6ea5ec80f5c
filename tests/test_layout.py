"""Dependencies point one way: training/ is a library with no web or queue imports."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPWARD = re.compile(r"^\s*(from|import)\s+(fastapi|celery|uvicorn|starlette|service|worker)\b",
                    re.MULTILINE)


def test_training_imports_no_web_or_queue_code() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "training").rglob("*.py")
                 if UPWARD.search(p.read_text())]
    assert offenders == []


def test_top_level_layout() -> None:
    for name in ("pyproject.toml", "training", "service", "worker", "deploy", "tests",
                 "README.md", "Makefile", ".ci/run"):
        assert (ROOT / name).exists(), name
