"""The README and the manual speak of the product and its code, not of how it was made:
no "session", no issue numbers, no "review commit", no rounds of work. A figure names the
date and the commit it was measured on ("measured on commit abc1234"), not the round of
work that measured it.

The check is deliberately simple: the word "session" is flagged wherever it stands, in
any case and inside longer words ("sessions", "session's"), so a page that means a
product's session (an HTTP session, a browser session) says it another way ("connection",
"browser context"). Also flagged: "issue" followed by a number ("issue 42", "issue #42",
"issues 38"), "review commit", an ordinal or numbered round of work ("the ninth round",
"the fourth session", "round 3", "5th stop") and a round or stop of work named relative to
another ("this round", "the previous round", "an earlier stop's"); "the other way round"
and a benchmark's "alternating rounds" are not. Files checked: README.md and every
Markdown and Python file under docs/ (the pages and the hook that renders the reference
pages)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
            "twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|"
            "nineteenth|twentieth|\\d+(?:st|nd|rd|th)")
NARRATION = re.compile(
    r"session"
    r"|\bissues?\s*#?\d+"
    r"|\breview\s+commits?\b"
    rf"|\b(?:{ORDINALS})\s+(?:round|session|stop)s?\b"
    r"|\b(?:round|session|stop)\s+#?\d+\b"
    r"|\b(?:this|that|the\s+previous|the\s+last|the\s+next|an\s+earlier|a\s+later)\s+"
    r"(?:round|stop)(?:'s)?\b",
    re.IGNORECASE)


def narration(text: str) -> list[tuple[int, str]]:
    """(line number, the words that narrate) for every match in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, m.group(0)) for m in NARRATION.finditer(line)]
    return found


def checked_files() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").rglob("*") if p.suffix in (".md", ".py"))
    return [REPO / "README.md", *docs]


def test_the_readme_and_the_manual_hold_no_narration() -> None:
    files = checked_files()
    assert REPO / "docs" / "hooks" / "reference_pages.py" in files
    assert len([p for p in files if p.suffix == ".md"]) > 20
    found = [f"{p.relative_to(REPO)}:{n}: {words!r}"
             for p in files for n, words in narration(p.read_text(encoding="utf-8"))]
    assert found == [], "narration of how the product was made:\n" + "\n".join(found)


@pytest.mark.parametrize("text", [
    "measured in the ninth session's review commit abc1234",
    "the fourth session of 2026-11-26",
    "Sessions ran on faster machines",
    "as issue 42 found",
    "fixed (issue #42)",
    "the review commit was measured again",
    "not solved in this round",
    "the ninth round of work",
    "round 3 measured it",
    "an earlier stop's machine",
])
def test_the_check_flags_narration(text: str) -> None:
    assert narration(text), text


@pytest.mark.parametrize("text", [
    "measured on commit abc1234 (2026-11-28)",
    "the adapter maps the other way round",
    "measured in alternating rounds, with a warm-up per round",
    "cancel after a switch stops the backfill",
    "an issue with the index",
    "the first run on the same code",
])
def test_the_check_lets_product_text_through(text: str) -> None:
    assert narration(text) == [], text
