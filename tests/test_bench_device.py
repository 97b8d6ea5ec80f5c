"""``--device`` of ``bench serve``, ``bench migrate`` and ``bench rerank``: resolved once,
as the service picks its device (auto: CUDA when present, else the CPU); ``--device cuda``
without CUDA stops the bench before it starts anything. And the phase lines they print."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch

from service.bench.phases import Phases, resolve_device


@pytest.mark.parametrize(("cuda", "expected"), [(True, "cuda"), (False, "cpu")])
def test_auto_is_cuda_when_present_else_cpu(monkeypatch: pytest.MonkeyPatch, cuda: bool,
                                             expected: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto") == expected
    assert resolve_device(None) == expected  # no option given: auto
    assert resolve_device("cpu") == "cpu"


def test_cuda_when_present_is_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("cuda") == "cuda"


def test_cuda_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--device cuda: CUDA is not available"):
        resolve_device("cuda")


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(SystemExit, match="--device tpu: not one of auto, cpu, cuda"):
        resolve_device("tpu")


@pytest.mark.parametrize("bench", ["serve", "migrate", "rerank"])
def test_the_benches_take_device_auto_by_default(bench: str) -> None:
    from training.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["bench", bench]).device == "auto"
    assert parser.parse_args(["bench", bench, "--device", "cpu"]).device == "cpu"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", bench, "--device", "tpu"])


@pytest.mark.parametrize("bench", ["serve", "migrate", "rerank"])
def test_cuda_without_cuda_stops_the_bench_before_anything_starts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bench: str) -> None:
    from training.cli import build_parser

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    args = build_parser().parse_args(["bench", bench, "--quick", "--device", "cuda",
                                      "--out", str(out)])
    with pytest.raises(SystemExit, match="CUDA is not available"):
        args.func(args)
    assert not out.exists()  # no work directory made, nothing started


def test_a_phase_line_counts_and_times_the_phases() -> None:
    stream = io.StringIO()
    phase = Phases("migrate", 6, stream)
    phase("run A: backfill with no rate limit (20,000 items)")
    phase("checks")
    lines = stream.getvalue().splitlines()
    assert re.fullmatch(r"bench migrate: \[1/6\] \[\+\d+\.\d s\] run A: backfill with no "
                        r"rate limit \(20,000 items\)", lines[0])
    assert re.fullmatch(r"bench migrate: \[2/6\] \[\+\d+\.\d s\] checks", lines[1])
