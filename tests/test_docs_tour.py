"""The front door cannot drift from the code: every command of the tutorial
(``docs/tutorial.md``) runs, in order, against the real stack that ``make serve`` starts
(``python -m service.stack.launch``: the first-start bootstrap, the embedded worker and
broker, the gateway), on a temporary data directory; and every command of the README's
tour is one of the tutorial's, so it runs too.

Each ``bash`` block runs in a shell in a working directory whose ``data`` is the stack's
data directory (as ``./data`` is for ``make serve``), with ``.venv`` there pointing at this
interpreter's environment. A block followed by a ``json`` or ``text`` block has that
output checked against what the command printed: every key a JSON output shows must be in
the real answer, and every labelled line of a text output must start a line of the real
one (values, ids and numbers differ from run to run; names must not).

What differs from a user's run, and why (``SIZE``: each must still be found in the
tutorial, so a changed command fails here rather than going untested):
- the bootstrap registers a micro v1 and renders 40 images, not a tiny v1 trained on 2,000,
  and the candidate's world has 40 images, not 8,000;
- the candidate is trained from v1's own weights for two steps at a learning rate too small
  to move a float32 weight (1e-12): the same
  retrieval as v1, so the gates it meets pass by construction (quality is what the
  benchmarks measure; this test checks that the commands work and say what the docs say);
- the gateway listens on a free port, which ``localhost:8000`` and ``NOBACKFILL_GATEWAY``
  are pointed at.
Blocks marked ``<!-- not run by tests/test_docs_tour.py: why -->`` are not run: starting
the stack, which the fixture does, and the ways on from a failed gate, which a candidate
that passes every gate never takes; the ``nobackfill`` commands among them are still
parsed by the CLI, so an option they use cannot disappear unnoticed.

Every waiting step is a command that ends (``--wait`` with ``--timeout``): a block runs
under ``BLOCK_TIMEOUT_S``, and a wait that never ends fails the test there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_web_browser import stop_stack, tail

from service.bench.tutorial import KEY, wait_ready
from service.stack.tutorial import NOT_RUN, Shell, commands, tour

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "tutorial.md"
README = REPO / "README.md"
WORLD = 40
BLOCK_TIMEOUT_S = 240
READY_S = 240
ID = re.compile(r"job-[0-9a-f]+")


# ---------------------------------------------------------------- checking outputs
def json_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in json_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in json_keys(v)}
    return set()


def check_json(shown: str, real: str) -> None:
    keys = set(re.findall(r'"([^"\s]+)":', shown))
    try:
        present = json_keys(json.loads(real))
    except json.JSONDecodeError:
        present = set(re.findall(r'"([^"\s]+)":', real))
    assert keys - present == set(), f"keys shown but not answered:\n{real[:3000]}"


def label(line: str) -> str | None:
    """A line's label: its first word (ids normalised), unless it is a number or an
    elision."""
    words = ID.sub("JOB", line).lstrip("* ").split()
    if not words or words[0] in ("...", "…") or re.match(r"[-+\d.%–]", words[0]):
        return None
    return words[0]


# The labels of lines only the full-size run prints, whose outputs the tutorial shows: a
# plan that recommends an option (rerank@10: its end table, "at the end ...", and its
# curve, "curve of ...", "backfilled ...") and a route whose gate failed (the echo after
# the apply, "the route does not serve ..."). At the test's size the candidate retrieves
# exactly like v1: the plan recommends nothing and every gate passes.
FULL_SIZE_ONLY = frozenset({"at", "curve", "backfilled", "the"})


def check_text(shown: str, real: str, absent_here: frozenset[str] = frozenset()) -> None:
    """Every labelled line shown starts a line that was printed (but the labels
    ``absent_here``, which this run cannot print)."""
    present = {label(line) for line in real.splitlines()} | {None} | absent_here
    missing = [line for line in shown.splitlines() if label(line) not in present]
    assert missing == [], f"lines shown but not printed: {missing}\n--- printed\n{real[:4000]}"


# ---------------------------------------------------------------- the stack
@dataclass(frozen=True)
class Stack:
    url: str
    work: Path  # the reader's working directory: its ./data is the stack's data directory
    log: Path


def stack_env(work: Path, v1: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOBACKFILL_")}
    env.update({"NOBACKFILL_DATA_DIR": str(work / "data"),  # the worker runs elsewhere
                "NOBACKFILL_ADMIN_API_KEYS": json.dumps({"ops": KEY}),
                "NOBACKFILL_BOOTSTRAP_MODEL": str(v1), "NOBACKFILL_BOOTSTRAP_IMAGES": str(WORLD),
                "NOBACKFILL_PORT": str(port), "NOBACKFILL_DEVICE": "cpu",
                "NOBACKFILL_ACCESS_LOG": "false", "NOBACKFILL_REGISTRY_POLL_INTERVAL_S": "0.2",
                "NOBACKFILL_APPLY_INTERVAL_S": "0.2", "NOBACKFILL_JOB_HEARTBEAT_S": "0.3",
                "NOBACKFILL_WORKER_HEARTBEAT_S": "1", "OMP_NUM_THREADS": "1"})
    return env


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory,
          micro_versions: dict[str, Path]) -> Iterator[Stack]:
    from service.stack.launch import free_port

    work = tmp_path_factory.mktemp("reader")
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    port = free_port()
    log = work.parent / "stack.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.stack.launch"], cwd=work,
                                env=stack_env(work, micro_versions["v1"], port), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, READY_S, log)
        except RuntimeError as exc:
            pytest.fail(f"{exc}:\n{tail(log)}")
        yield Stack(url, work, log)
    finally:
        stop_stack(proc, log)


def reader_shell(stack: Stack, micro_config_file: Path, v1: Path) -> Shell:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOBACKFILL_")}
    env["NOBACKFILL_GATEWAY"] = stack.url
    size = {"training/configs/tiny-new.json --steps 800":
            f"{micro_config_file} --checkpoint {v1 / 'model.safetensors'} --lr 1e-12 "
            f"--batch-size 20 --steps 2",
            "--n 8000": f"--n {WORLD}",
            "localhost:8000": stack.url.removeprefix("http://")}
    return Shell(stack.work, env, size, BLOCK_TIMEOUT_S)


# ---------------------------------------------------------------- tests
def test_the_readme_tour_is_the_tutorials() -> None:
    """Every command the README runs (outside blocks marked as not run) is a command of
    the tutorial, in the tutorial's order: running the tutorial runs the README's tour."""
    tutorial = [c for b in tour(TUTORIAL) if b.run for c in commands(b.code)]
    readme = [c for b in tour(README) if b.run for c in commands(b.code)]
    assert readme, "the README shows no command to run"
    missing = [c for c in readme if c not in tutorial]
    assert missing == [], f"README commands the tutorial does not run: {missing}"
    positions = [tutorial.index(c) for c in readme]
    assert positions == sorted(positions), "the README runs the tour in another order"


def test_the_stack_the_tutorial_starts_is_make_serve() -> None:
    """The tour's first block starts ``make serve`` and is not run: the fixture runs what
    that target runs. Every block the test does not run says why."""
    blocks_ = tour(TUTORIAL)
    skipped = [b for b in blocks_ if not b.run]
    assert skipped and commands(skipped[0].code) == [
        "NOBACKFILL_ADMIN_API_KEYS='{\"ops\": \"" + KEY + "\"}' make serve"]
    assert blocks_.index(skipped[0]) == 0, "the tour must start with make serve"
    reasons = re.findall(re.escape(NOT_RUN) + r":?(.*?)-->", TUTORIAL.read_text())
    assert len(reasons) == len(skipped) and all(r.strip() for r in reasons), reasons
    serve = re.search(r"^serve:.*\n\t(.*)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert serve and serve.group(1).endswith("-m service.stack.launch")


def test_the_commands_not_run_still_parse() -> None:
    """The ``nobackfill`` commands of the blocks the test does not run are parsed by the
    CLI (without running them): an option or a subcommand they name exists."""
    from training.cli import build_parser

    parsed = 0
    for block in tour(TUTORIAL):
        if block.run:
            continue
        for line in commands(block.code):
            argv = shlex.split(line)
            if not argv or not argv[0].endswith("bin/nobackfill"):
                continue
            try:
                build_parser().parse_args(argv[1:])
            except SystemExit as exc:
                pytest.fail(f"the CLI refuses a command of the tutorial ({exc}): {line}")
            parsed += 1
    assert parsed >= 3, "the tutorial's ways on from a failed gate name no nobackfill command"


def test_every_wait_of_the_tutorial_ends() -> None:
    """Pasting the tutorial never hangs: no shell loop waits for a status (one polling a
    wrong id or a failed job would go on for ever), and every ``--wait`` has a
    ``--timeout``."""
    for block in tour(TUTORIAL):
        for line in commands(block.code):
            words = line.split()
            assert words[0] not in ("until", "while"), f"a wait that may not end: {line}"
            assert "--wait" not in words or "--timeout" in words, f"--wait, no --timeout: {line}"


def test_the_output_checks_can_fail() -> None:
    check_json('{"gallery": "demo", "hits": [{"id": "x"}]}', '{"gallery": "d", "hits": [{"id": "y", "s": 1}]}')
    with pytest.raises(AssertionError, match="keys shown but not answered"):
        check_json('{"gallery": "demo", "space": "v1"}', '{"gallery": "demo"}')
    check_text("plan         job-1f\nstatus       succeeded\n  0.0%  1", "plan job-2a\nstatus x")
    with pytest.raises(AssertionError, match="not printed"):
        check_text("recommendation: none", "plan job-2a")


def test_the_tutorial_runs(stack: Stack, micro_config_file: Path,
                           micro_versions: dict[str, Path]) -> None:
    """Every block of the tutorial, in order, and what each prints against what the
    tutorial shows; at the end the gallery answers natively in the candidate's space."""
    shell = reader_shell(stack, micro_config_file, micro_versions["v1"])
    text = TUTORIAL.read_text()
    for doc in shell.size:
        assert doc in text, f"the tutorial no longer says {doc!r}: update SIZE"
    ran = 0
    for block in tour(TUTORIAL):
        if not block.run:
            continue
        printed = shell.run(block.code)
        ran += 1
        if block.output is not None and block.output.lang == "json":
            check_json(block.output.code, printed)
        elif block.output is not None:
            check_text(block.output.code, printed, FULL_SIZE_ONLY)
    assert ran >= 8 and {"PLAN_ID", "JOB_ID"} <= set(shell.captured)
    answer = httpx.post(f"{stack.url}/v1/galleries/demo/search",
                        json={"text": "a red circle"}, timeout=30).json()
    assert (answer["space"], answer["route"]) == ("v2", "native"), answer
