"""``nobackfill bench tutorial``: the tutorial run as a reader runs it, at full size, timed.

Starts ``make serve``'s stack (``python -m service.stack.launch``) on an empty data
directory in ``--out`` (the first-start bootstrap trains the demo's tiny v1 and ingests its
2,000 images), then runs every ``bash`` block of ``docs/tutorial.md`` in order as written
(``service.stack.tutorial``: the same runner as the test suite's, with nothing made
smaller; only ``localhost:8000`` is pointed at the free port the stack got), and prints how
long the bootstrap and each step took. Every block's output is kept in ``--out``
(``steps.json``, ``outputs.md``): the outputs the tutorial shows come from there.

Plugged into the CLI through the ``nobackfill.benchmarks`` entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from training.console import report_command

KEY = "change-me"  # the admin key the tutorial starts the stack with
PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="the tutorial's commands as written against a fresh make "
                                  "serve, each step timed and its output kept")
    p.add_argument("--out", default="runs/bench-tutorial", help="the stack's data, logs and "
                                                                "every step's output")
    p.add_argument("--page", default=str(PAGE), help="the tutorial page to run")
    p.add_argument("--ready-timeout", type=float, default=3600.0,
                   help="seconds for the first start (bootstrap included)")
    p.add_argument("--step-timeout", type=float, default=3600.0, help="seconds per block")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))


def headings(page: str, codes: list[str]) -> list[str]:
    """Per block (in page order) the section heading it stands under."""
    out, at = [], 0
    for code in codes:
        at = page.index(code, at)
        heads = [line for line in page[:at].splitlines() if line.startswith("## ")]
        out.append(heads[-1].removeprefix("## ") if heads else "")
        at += len(code)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from service.stack.launch import free_port, stop
    from service.stack.tutorial import Shell, StepFailed, commands, tour
    from service.state.lifeline import parent_env

    out, page = Path(args.out).resolve(), Path(args.page)
    if out.exists():
        raise SystemExit(f"{out} exists; remove it or choose another --out")
    work = out / "work"
    work.mkdir(parents=True)
    # the reader's checkout as the tutorial sees it: its .venv and training/configs, and
    # ./data the stack's data directory (a fresh one)
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    (work / "training").symlink_to(PAGE.parents[1] / "training")
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NOBACKFILL_")}
    env = {**clean, **parent_env(), "NOBACKFILL_DATA_DIR": str(work / "data"),
           "NOBACKFILL_PORT": str(port),
           "NOBACKFILL_ADMIN_API_KEYS": json.dumps({"ops": KEY})}
    url = f"http://127.0.0.1:{port}"
    log = out / "stack.log"
    phase("starting make serve's stack on an empty data directory (the bootstrap trains "
          f"the demo's v1 first; its log: {log})")
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "service.stack.launch"], cwd=work,
                                env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    steps: list[dict[str, Any]] = []
    ready_s, failed = None, None
    try:
        wait_ready(url, proc, args.ready_timeout, log)
        ready_s = time.perf_counter() - start
        phase(f"ready after {ready_s:.0f} s; running the tutorial's blocks")
        shell = Shell(work, {**clean, "NOBACKFILL_GATEWAY": url},
                      {"localhost:8000": url.removeprefix("http://")}, args.step_timeout)
        run_blocks = [b for b in tour(page) if b.run]
        text = page.read_text()
        for block, head in zip(run_blocks, headings(text, [b.code for b in run_blocks]),
                               strict=True):
            first = commands(block.code)[-1]
            phase(f"{head}: {first[:100]}")
            t0 = time.perf_counter()
            try:
                printed = shell.run(block.code)
            except StepFailed as exc:
                failed = {"section": head, "command": first, "error": str(exc)}
                raise
            steps.append({"section": head, "command": first,
                          "seconds": round(time.perf_counter() - t0, 1), "output": printed})
    finally:
        stop(proc, 60)
        keep(out, page, ready_s, steps, failed, time.perf_counter() - start)
    return {"page": str(page), "ready_seconds": round(ready_s or 0.0, 1),
            "steps": [{x: s[x] for x in ("section", "command", "seconds")} for s in steps],
            "total_seconds": round(time.perf_counter() - start, 1)}


def keep(out: Path, page: Path, ready_s: float | None, steps: list[dict[str, Any]],
         failed: dict[str, Any] | None, total_s: float) -> None:
    """Every step's output in ``out`` (``steps.json``, ``outputs.md``), also when a step
    failed (its error last)."""
    (out / "steps.json").write_text(json.dumps(
        {"page": str(page), "ready_seconds": ready_s, "steps": steps, "failed": failed,
         "total_seconds": round(total_s, 1)}, indent=1))
    parts = [f"## {s['section']} ({s['seconds']} s)\n\n```bash\n{s['command']}\n```\n\n"
             f"```text\n{s['output'].rstrip()}\n```" for s in steps]
    if failed:
        parts.append(f"## {failed['section']}: failed\n\n```text\n{failed['error']}\n```")
    (out / "outputs.md").write_text("\n\n".join(parts) + "\n")


def phase(message: str) -> None:
    print(f"bench tutorial: {message}", file=sys.stderr, flush=True)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    """Until the gateway of ``make serve``'s stack answers and has seen the embedded
    worker; ``RuntimeError`` if the stack exits or the time runs out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the stack exited with {proc.returncode}; see {log}")
        try:
            r = httpx.get(f"{url}/readyz", headers={"X-API-Key": KEY}, timeout=5)
            if r.status_code == 200 and r.json().get("workers"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the stack was not ready with a worker after {timeout_s:.0f} s; "
                       f"see {log}")


def render(r: dict[str, Any]) -> str:
    lines = [f"bench tutorial: {r['page']}, as written, against a fresh make serve", "",
             "| step | command | seconds |", "|---|---|---|",
             ("| 1. Start the service | make serve (first start: bootstrap, worker, gateway "
              f"ready) | {r['ready_seconds']:.0f} |")]
    for s in r["steps"]:
        command = s["command"] if len(s["command"]) <= 70 else s["command"][:67] + "..."
        lines.append(f"| {s['section']} | `{command}` | {s['seconds']:.1f} |")
    lines += ["", (f"total {r['total_seconds'] / 60:.1f} min (the outputs: steps.json and "
                   "outputs.md in --out)")]
    return "\n".join(lines)
