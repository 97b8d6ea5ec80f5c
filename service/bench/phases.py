"""What a service benchmark (``bench serve``, ``bench migrate``, ``bench rerank``) settles
before it starts and says while it runs: the device its models run on, taken as the
service takes it (``--device auto``: CUDA when present, else the CPU), and one line per
phase on standard error, so that a long run shows where it is (not only progress bars).

Imports nothing heavy at the top (the CLI imports the benchmarks' modules to build its
parser); torch is imported when the device is resolved."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

DEVICES = ("auto", "cpu", "cuda")


def add_device_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--device`` (auto, cpu or cuda; default auto) for the models of ``what``."""
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help=f"torch device for {what}; auto (the default): cuda when present, "
                        "else cpu, as the service picks it")


def resolve_device(requested: str | None) -> str:
    """The concrete device for ``--device``: "auto" (or None) is "cuda" when torch sees a
    CUDA device, else "cpu". "cuda" without one is a SystemExit, raised before the bench
    starts anything."""
    import torch

    wanted = requested or "auto"
    if wanted not in DEVICES:
        raise SystemExit(f"--device {wanted}: not one of {', '.join(DEVICES)}")
    available = torch.cuda.is_available()
    if wanted == "auto":
        return "cuda" if available else "cpu"
    if wanted == "cuda" and not available:
        raise SystemExit("--device cuda: CUDA is not available on this machine "
                         "(torch.cuda.is_available() is False); use --device cpu or auto")
    return wanted


class Phases:
    """``phases("run A: ...")`` writes ``bench NAME: [i/total] [+S s] run A: ...`` to
    ``stream`` (default: standard error, looked up at each line) and flushes: i counts the
    calls, S is the seconds since this object was made (the bench's start)."""

    def __init__(self, bench: str, total: int, stream: TextIO | None = None) -> None:
        self.bench, self.total, self.stream = bench, total, stream
        self.done = 0
        self.start = time.perf_counter()

    def __call__(self, what: str) -> None:
        self.done += 1
        stream = self.stream or sys.stderr
        elapsed = time.perf_counter() - self.start
        print(f"bench {self.bench}: [{self.done}/{self.total}] [+{elapsed:.1f} s] {what}",
              file=stream, flush=True)
