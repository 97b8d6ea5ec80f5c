"""The tutorial (``docs/tutorial.md``) as a script: its fenced blocks in order, each ``bash``
block run in a shell the way a reader pastes it.

Two readers: the test suite (``tests/test_docs_tour.py``), which runs every block at a
small size against ``make serve``'s stack and checks each output's shape, and ``nobackfill
bench tutorial`` (``service.bench.tutorial``), which runs the blocks as written (full size)
and times each step. A block preceded by ``<!-- not run by tests/test_docs_tour.py: why -->``
is skipped by both; a ``json`` or ``text`` block right after a ``bash`` block shows what
that command prints.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NOT_RUN = "<!-- not run by tests/test_docs_tour.py"
# Placeholders the reader copies from an earlier output, found there by the runner.
CAPTURES = {"PLAN_ID": r"^plan\s+(job-[0-9a-f]+)",
            "JOB_ID": r"started \S+ job (job-[0-9a-f]+)",
            "VERSION": r"^version\s+(v-[0-9]+-[0-9a-f]+)"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


class StepFailed(RuntimeError):
    """A block exited with a non-zero status (the message holds its output's tail)."""


@dataclass
class Block:
    lang: str
    code: str
    run: bool  # False: marked as not run
    output: Block | None = None  # the json/text block that shows what it prints


def blocks(markdown: str) -> list[Block]:
    """The fenced blocks in order; an output block is attached to the command before it."""
    found: list[Block] = []
    last_end = 0
    for match in FENCE.finditer(markdown):
        between = markdown[last_end:match.start()]
        lang, code = match.group(1), match.group(2)
        if lang in ("json", "text") and found and not between.strip() and found[-1].lang == "bash":
            found[-1].output = Block(lang, code, False)
        else:
            found.append(Block(lang, code, NOT_RUN not in between))
        last_end = match.end()
    return found


def tour(path: Path) -> list[Block]:
    """The ``bash`` blocks of a page, in order (with the output each shows)."""
    return [b for b in blocks(path.read_text()) if b.lang == "bash"]


def assignment(line: str) -> bool:
    line = line.split("#", 1)[0].strip()
    return not line or re.fullmatch(r"""(export\s+)?\w+=('[^']*'|"[^"]*"|\S+)""",
                                    line) is not None


def commands(code: str) -> list[str]:
    """A block's commands, continuation lines joined, comments and spaces normalised."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
    return [re.sub(r"\s+", " ", line) for line in lines if line and not line.startswith("#")]


@dataclass
class Shell:
    """Runs the blocks one after the other in ``cwd``, carrying the variables the reader set
    in earlier blocks (a block of assignments only), replacing each of ``size``'s texts
    (what the page says -> what this run uses) and the placeholders (``CAPTURES``) with what
    an earlier output gave."""

    cwd: Path
    env: dict[str, str]
    size: dict[str, str]
    timeout_s: float = 240.0
    setup: list[str] = field(default_factory=list)
    captured: dict[str, str] = field(default_factory=dict)

    def command(self, code: str) -> str:
        for doc, here in self.size.items():
            code = code.replace(doc, here)
        for name in CAPTURES:
            if name in code:
                if name not in self.captured:
                    raise StepFailed(f"{name} is used before any output gave it")
                code = code.replace(name, self.captured[name])
        return code

    def run(self, code: str) -> str:
        """The block's standard output; ``StepFailed`` if it exits with an error."""
        script = "\n".join(["set -e", *self.setup, self.command(code)])
        done = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, check=False,
                              capture_output=True, text=True, timeout=self.timeout_s)
        if done.returncode != 0:
            raise StepFailed(f"exit {done.returncode}:\n{code}\n--- stdout\n"
                             f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
        if all(assignment(line) for line in code.strip().splitlines()):
            self.setup.append(code)  # variables only: every later block starts with them
        for name, pattern in CAPTURES.items():
            found = re.findall(pattern, done.stdout, re.MULTILINE)
            if found:
                self.captured[name] = found[-1]
        return done.stdout
