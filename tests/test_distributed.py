"""Data-parallel training (training.distributed): 2 gloo ranks of batch B/2 give what one
process with batch B gives, for every method; the pieces that make it so (sharding,
gathering with gradients, reduced statistics); bad input; rank failure and cancellation.

The multi-rank runs share one launch (two spawned CPU processes, one thread each) to keep
the suite short: every method runs in it one after the other, and the references run
here, in one process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import artifact_tensors, micro_model
from tests.rank_entries import fail_on_rank_one, train_forever
from training.artifacts import Artifact, load_artifact
from training.continual.phase import run_phase
from training.continual.strategy import PhaseOptions
from training.contrastive import train_contrastive
from training.data import PairDataset, generate_items
from training.distributed import (
    RankFailed,
    World,
    check_batches,
    check_gpus,
    gather,
    launch,
    run_ranks,
)
from training.encoders import create_model
from training.errors import ConfigError
from training.trainer import TrainConfig
from training.upgrades.run import upgrade
from training.upgrades.xbt.config import XbtConfig

BATCH = 16  # the global batch: 8 per rank with 2 ranks
STEPS = 2  # the second step of CTP scores the queue the first one filled
TOL = {"rtol": 1e-4, "atol": 2e-6}



@pytest.fixture(scope="module")
def data() -> PairDataset:
    return PairDataset.from_synth(generate_items(48, seed=11, id_prefix="d-"), image_size=32)


@pytest.fixture(scope="module")
def parent(data: PairDataset, tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    out = tmp_path_factory.mktemp("dist") / "v0"
    return train_contrastive(micro_model(), data, TrainConfig(steps=2, batch_size=16), out,
                             version_id="v0", show_progress=False)


def _phase(method: str, data: PairDataset, parent: Artifact, out: Path,
           **config: Any) -> dict[str, Any]:
    from training.continual import get_strategy

    language = "de" if method == "teir" else None
    # Adam's first steps move a weight by about lr * sign(g) even where g is float noise
    # (an attention key bias gets exactly zero gradient in exact arithmetic): eps keeps
    # such noise from reaching the weights, so the comparison can be tight
    config.setdefault("adam_eps", 1e-6)
    return {"parent": parent.path, "method": method, "data": data, "out": out / method,
            "config": get_strategy(method).Config.from_dict(config),
            "options": PhaseOptions(steps=STEPS, batch_size=BATCH, seed=3, language=language,
                                    version_id=f"v-{method}", show_progress=False),
            "prior": data if method == "dns" else None}


def _xbt(data: PairDataset, parent: Artifact, out: Path, method: str = "xbt") -> dict[str, Any]:
    anchors = method == "xbt"  # Direct trains against the old model and takes no anchors
    cfg = XbtConfig(method=method, pretrain_steps=STEPS, pretrain_batch_size=BATCH, steps=STEPS,
                    batch_size=BATCH, lora_dropout=0.0, anchor=anchors, pair_anchor=anchors,
                    seed=5, select_every=0)
    return {"old": parent, "new": micro_model(32), "corpus": "synth:64", "pairs": data,
            "out": out / method, "cfg": cfg, "version_id": f"v-{method}",
            "show_progress": False}


def _base(data: PairDataset, parent: Artifact, out: Path) -> dict[str, Any]:
    return {"spec": micro_model(), "dataset": data, "out": out / "clip", "version_id": "b",
            "cfg": TrainConfig(steps=STEPS, batch_size=BATCH, lr=1e-3, adam_eps=1e-6),
            "show_progress": False}


# (name, entry point, kwargs builder); config values keep each method's update visible
RUNS = [
    ("clip", train_contrastive, _base),
    ("seqft", run_phase, lambda d, p, o: _phase("seqft", d, p, o, lr=1e-3)),
    ("modx", run_phase, lambda d, p, o: _phase("modx", d, p, o, lr=1e-3)),
    ("ctp", run_phase, lambda d, p, o: _phase("ctp", d, p, o, lr=1e-3, queue_size=24)),
    ("dns", run_phase, lambda d, p, o: _phase("dns", d, p, o, lr=1e-2, lambda_min=1e-3,
                                                lambda_min_out=3e-3, adam_eps=1e-4)),
    ("teir", run_phase, lambda d, p, o: _phase("teir", d, p, o, lr=1e-2, max_merges=40)),
    ("xbt", upgrade, _xbt),
    ("direct", upgrade, lambda d, p, o: _xbt(d, p, o, method="direct")),
]


def _all_methods(world: World, payload: list[tuple[Any, dict[str, Any]]],
                 report: Any) -> None:
    """One rank of the shared launch: every method in turn, in the same process group,
    rank 0 reporting progress."""
    for fn, kwargs in payload:
        fn(**kwargs, device=str(world.device), on_progress=report)


RESUME_STEPS = 12


def _resumable(data: PairDataset, parent: Artifact, out: Path, name: str,
               checkpoints: Path | None) -> dict[str, Any]:
    """A CTP phase (momentum model and queues: task state beyond the weights) long enough
    to be stopped mid-run, saving its whole state every 2 steps under ``checkpoints``."""
    kwargs = _phase("ctp", data, parent, out, lr=1e-3, queue_size=24)
    options = kwargs["options"]
    kwargs["options"] = PhaseOptions(**{**options.__dict__, "steps": RESUME_STEPS,
                                        "checkpoint_every": 2 if checkpoints else 0,
                                        "checkpoint_dir": str(checkpoints) if checkpoints
                                        else None})
    return {**kwargs, "out": out / name}


class Killed(Exception):
    """What stops the first run of the resume test (as a kill would)."""


@pytest.fixture(scope="module")
def interrupted(data: PairDataset, parent: Artifact,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2-rank CTP phase stopped, every rank with it, once its first state is saved."""
    root = tmp_path_factory.mktemp("resume")
    kwargs = _resumable(data, parent, root, "resumed", root / "checkpoints")
    state = root / "checkpoints" / "train_state.pt"
    progress: list[Any] = []

    def kill_once_saved() -> None:
        if state.is_file():
            raise Killed

    with pytest.raises(Killed):
        run_ranks(2, run_phase, kwargs, device="cpu", on_progress=progress.append,
                  check=kill_once_saved, threads=1)
    assert not (root / "resumed").exists(), "finished before it could be stopped"
    return {"kwargs": kwargs, "stopped_at": progress[-1].step if progress else 0}


@pytest.fixture(scope="module")
def runs(data: PairDataset, parent: Artifact, interrupted: dict[str, Any],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Artifact, Artifact]]:
    """(one process with batch B, two gloo ranks with B/2 each) per method; and under
    "resume", (2 ranks uninterrupted, 2 ranks resumed from the stopped run's state)."""
    root = tmp_path_factory.mktemp("equivalence")
    single = {name: fn(**build(data, parent, root / "one"), device="cpu")
              for name, fn, build in RUNS}
    two = [(fn, build(data, parent, root / "two")) for _, fn, build in RUNS]
    two += [(run_phase, _resumable(data, parent, root / "two", "uninterrupted", None)),
            (run_phase, interrupted["kwargs"])]
    launch(_all_methods, two, gpus=2, device="cpu", on_progress=PROGRESS.append, threads=1)
    assert sorted(p.name for p in (root / "two").iterdir()) == sorted(
        [n for n, _, _ in RUNS] + ["uninterrupted"])
    out = {name: (single[name], load_artifact(root / "two" / name)) for name, _, _ in RUNS}
    out["resume"] = (load_artifact(root / "two" / "uninterrupted"),
                     load_artifact(interrupted["kwargs"]["out"]))
    return out


PROGRESS: list[Any] = []  # what rank 0 reported during the shared launch



@pytest.mark.parametrize("method", [name for name, _, _ in RUNS])
def test_two_ranks_of_half_the_batch_train_what_one_process_trains(method, runs,
                                                                   parent) -> None:
    one, two = runs[method]
    a, b = artifact_tensors(one), artifact_tensors(two)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(b[key].float().numpy(), a[key].float().numpy(), **TOL,
                                   err_msg=f"{method}: {key}")
    # the check has teeth: training moved the weights far beyond the tolerance
    assert _moved(method, one, parent) > 1e-4, f"{method} barely trained"
    assert two.manifest["metrics"]["ranks"] == 2 and one.manifest["metrics"]["ranks"] == 1


def _moved(method: str, trained: Artifact, parent: Artifact) -> float:
    """The largest change training made: an upgrade's LoRA B matrices (they start at zero;
    the new model's own weights never change), else the weights against the parent's (a grown
    embedding compared on its original rows)."""
    is_upgrade = method in ("xbt", "direct")
    after = trained.tensors("adapters.safetensors" if is_upgrade else "model.safetensors")
    if is_upgrade:
        return max(float(v.abs().max()) for k, v in after.items() if "lora_B" in k)
    if method == "clip":  # trained from its seeded initialisation, not from the parent
        torch.manual_seed(0)
        before = {k: v.detach() for k, v in create_model(micro_model()).state_dict().items()}
    else:
        before = parent.tensors("model.safetensors")
    return max(float((after[k].float().reshape(-1)[:before[k].numel()]
                      - before[k].float().reshape(-1)).abs().max()) for k in before)


def test_losses_and_reported_state_match_too(runs) -> None:
    assert PROGRESS and PROGRESS[-1].stage == "continual-ctp"  # rank 0 reported
    assert PROGRESS[-1].step == PROGRESS[-1].total == RESUME_STEPS
    seqft_one, seqft_two = runs["seqft"]
    assert seqft_two.manifest["metrics"]["final_loss"] == pytest.approx(
        seqft_one.manifest["metrics"]["final_loss"], rel=1e-5)
    # CTP's queues: the global batch of momentum features, same slots, same order
    ctp_one, ctp_two = runs["ctp"]
    q_one, q_two = ctp_one.tensors("state.safetensors"), ctp_two.tensors("state.safetensors")
    assert int(q_two["ctp/filled"]) == int(q_one["ctp/filled"]) == STEPS * BATCH - 8
    np.testing.assert_allclose(q_two["ctp/queue_image"], q_one["ctp/queue_image"], **TOL)
    # DNS: moments over all rows (counts summed over the ranks, not one rank's share)
    dns_one, dns_two = runs["dns"]
    s_one, s_two = dns_one.tensors("state.safetensors"), dns_two.tensors("state.safetensors")
    assert int(s_two["dns/image_count"]) == int(s_one["dns/image_count"]) == 2 * 48
    # TEIR: the same vocabulary and token statistics on every rank
    teir_one, teir_two = runs["teir"]
    assert teir_two.manifest["phase"]["new_tokens"] == teir_one.manifest["phase"]["new_tokens"] > 0
    assert teir_two.manifest["phase"]["tokens_used"] == teir_one.manifest["phase"]["tokens_used"]
    # XBT: stage 1's and stage 2's losses as one process computed them
    x_one, x_two = (r.manifest["metrics"] for r in runs["xbt"])
    for stage in ("pretrain", "stage2"):
        assert x_two[stage]["first_loss"] == pytest.approx(x_one[stage]["first_loss"], rel=1e-5)


def test_a_stopped_multi_rank_run_resumes_to_the_uninterrupted_artifact(runs,
                                                                       interrupted) -> None:
    uninterrupted, resumed = runs["resume"]
    assert 2 <= interrupted["stopped_at"] < RESUME_STEPS  # stopped mid-run, after a save
    a, b = artifact_tensors(uninterrupted), artifact_tensors(resumed)
    assert a.keys() == b.keys() and any(k.startswith("state.safetensors:ctp/") for k in a)
    for key in a:  # same weights, and the same CTP queues (task state restored)
        np.testing.assert_allclose(b[key].float().numpy(), a[key].float().numpy(), **TOL,
                                   err_msg=key)


# ---------------------------------------------------------------- pieces, in one process
def test_a_single_process_world_changes_nothing() -> None:
    world = World.current()
    assert (world.rank, world.size, world.is_main, world.distributed) == (0, 1, True, False)
    x = torch.randn(4, 3, requires_grad=True)
    assert gather(x) is x and world.shard(x) is x


def test_a_rank_takes_its_contiguous_shard_and_the_batch_must_split_evenly() -> None:
    world = World(rank=1, size=2)
    batch = (torch.arange(8), torch.arange(8) * 10)
    images, captions = world.shard(batch)
    assert images.tolist() == [4, 5, 6, 7] and captions.tolist() == [40, 50, 60, 70]
    assert World(rank=2, size=3).row_range(10) == (8, 10)
    with pytest.raises(ConfigError, match="batch of 9 does not split evenly over 2 ranks"):
        world.shard(torch.arange(9))


@pytest.mark.parametrize("gpus,device,needle", [
    (0, "cpu", "gpus must be a whole number >= 1, got 0"),
    (-2, None, "gpus must be a whole number >= 1"),
    (1.5, None, "whole number"),
    (10_000, "cpu", "core(s); without CUDA each rank is a CPU process: ask for at most"),
    (2, "mps", "runs on cuda or cpu"),
])
def test_bad_gpu_counts_are_named(gpus, device, needle) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        check_gpus(gpus, device)


def test_a_batch_the_ranks_cannot_split_is_named_before_anything_starts() -> None:
    check_batches(4, batch_size=64, pretrain_batch_size=512)
    check_batches(1, batch_size=7)
    with pytest.raises(ConfigError, match="pretrain_batch_size=30 does not split evenly over "
                                          "gpus=4; choose a multiple of 4"):
        check_batches(4, batch_size=64, pretrain_batch_size=30)
    with pytest.raises(ConfigError, match="gpus must be a whole number >= 1, got 0"):
        check_batches(0, batch_size=8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a CPU-only host")
def test_cuda_ranks_on_a_host_without_cuda_are_refused() -> None:
    with pytest.raises(ConfigError, match="no CUDA device"):
        check_gpus(2, "cuda")
    assert check_gpus(2, "cpu") == "gloo"


# ---------------------------------------------------------------- failure and cancellation
def test_a_failing_rank_stops_the_others_and_is_named() -> None:
    with pytest.raises(RankFailed, match="rank 1 failed: ValueError: rank one cannot read"):
        launch(fail_on_rank_one, None, gpus=2, device="cpu", threads=1)


class Stop(Exception):
    pass


def test_cancelling_stops_every_rank(tmp_path: Path) -> None:
    seen: list[int] = []

    def on_progress(step: int) -> None:
        seen.append(step)
        if step >= 5:
            raise Stop  # what a cancelled job's heartbeat raises

    with pytest.raises(Stop):
        launch(train_forever, tmp_path, gpus=2, device="cpu", on_progress=on_progress,
               threads=1)
    assert seen and seen[-1] >= 5
    for rank in (0, 1):
        pid = int((tmp_path / f"rank{rank}.pid").read_text())
        assert not _alive(pid), f"rank {rank} (pid {pid}) outlived the cancellation"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


