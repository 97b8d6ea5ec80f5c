"""A stopped XBT (or Direct) upgrade resumes from its saved state to the artifact of an
uninterrupted run: stage 1 and stage 2 each save their whole state (stage 2's validation
curve and best checkpoint included), and a run started again with the same arguments goes
on from the last save. Tiny real open_clip models, real peft LoRA (dropout on)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import artifact_tensors, micro_model
from training.artifacts import Artifact, load_artifact
from training.contrastive import train_contrastive
from training.data import PairDataset, generate_items
from training.errors import ConfigError
from training.trainer import TrainConfig
from training.upgrades.run import upgrade
from training.upgrades.xbt.config import XbtConfig

STEPS = 12  # per stage; saved every 4 (stage 2 also at every selection point)



@pytest.fixture(scope="module")
def data() -> PairDataset:
    return PairDataset.from_synth(generate_items(64, seed=13, languages=("en",), id_prefix="r-"),
                                  image_size=32)


@pytest.fixture(scope="module")
def old(data: PairDataset, tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    return train_contrastive(micro_model(64), data, TrainConfig(steps=2, batch_size=16),
                             tmp_path_factory.mktemp("old") / "v0", version_id="v0",
                             show_progress=False)


class Stop(Exception):
    """What stops a run mid-stage, as a killed worker would."""


def _run(method: str, data: PairDataset, old: Artifact, out: Path, checkpoints: Path | None,
         stop_at: tuple[str, int] | None = None, seen: list | None = None) -> Artifact:
    anchors = method == "xbt"
    cfg = XbtConfig(method=method, pretrain_steps=STEPS, pretrain_batch_size=16, steps=STEPS,
                    batch_size=16, lora_dropout=0.1, anchor=anchors, pair_anchor=anchors,
                    seed=7, select_every=4 if method == "xbt" else 0)
    def progress(p: Any) -> None:
        if seen is not None:
            seen.append((p.stage.split(" (")[0], p.step))
        if stop_at is not None and stop_at[0] in p.stage and p.step == stop_at[1]:
            raise Stop
    return upgrade(old, micro_model(32), "synth:64", data, out, cfg, version_id=out.name,
                   device="cpu", show_progress=False, on_progress=progress,
                   checkpoint_dir=checkpoints, checkpoint_every=4 if checkpoints else 0)



@pytest.mark.parametrize("method,stops", [
    ("xbt", [("stage 1", 6), ("stage 2", 6)]),  # stopped in each stage, resumed twice
    ("direct", [("direct", 6)]),
])
def test_a_stopped_upgrade_resumes_to_the_uninterrupted_artifact(method, stops, data, old,
                                                                 tmp_path) -> None:
    whole = _run(method, data, old, tmp_path / "whole", None)
    checkpoints = tmp_path / "checkpoints"
    for stop in stops:
        with pytest.raises(Stop):
            _run(method, data, old, tmp_path / "resumed", checkpoints, stop)
        assert not (tmp_path / "resumed").exists()
    saved = sorted(p.parent.name for p in checkpoints.glob("*/train_state.pt"))
    assert saved == (["stage1", "stage2"] if method == "xbt" else ["direct"])
    seen: list[tuple[str, int]] = []
    resumed = _run(method, data, old, tmp_path / "resumed", checkpoints, seen=seen)
    # It went on from the last save (step 4 of the stage it stopped in), not from scratch:
    # stage 1 was done, so it reported none of its steps.
    assert seen[0] == (("xbt stage 2" if method == "xbt" else "direct baseline"), 5)
    metrics = resumed.manifest["metrics"]
    assert metrics["stage2" if method == "xbt" else "direct"]["resumed_from"] == 4
    assert whole.manifest["metrics"]["stage2" if method == "xbt" else "direct"][
        "resumed_from"] == 0
    a, b = artifact_tensors(whole), artifact_tensors(resumed)
    assert a.keys() == b.keys() and a
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    if method == "xbt":  # the selection saw the same curve and chose the same step
        chose = [art.manifest["metrics"]["selection"] for art in (whole, resumed)]
        assert chose[0]["curve"] == chose[1]["curve"] and len(chose[0]["curve"]) == 4
        assert chose[0]["chosen_step"] == chose[1]["chosen_step"]


def test_checkpoint_every_needs_a_directory(data, old, tmp_path) -> None:
    with pytest.raises(ConfigError, match="checkpoint_every"):
        upgrade(old, micro_model(32), "synth:64", data, tmp_path / "x", XbtConfig(pretrain_steps=2,
                steps=2), device="cpu", show_progress=False, checkpoint_every=5)
    assert not (tmp_path / "x").exists()


def test_a_stopped_two_rank_xbt_resumes_to_the_uninterrupted_artifact(data, old,
                                                                      tmp_path) -> None:
    """The same on 2 gloo ranks: rank 0 saves (the selection's state included: it alone
    selects), every rank restores, and the resumed run ends where the uninterrupted one
    does."""
    from tests.rank_entries import upgrade_stopped_at
    from training.distributed import RankFailed, launch, run_ranks

    def kwargs(out: Path, checkpoints: Path | None) -> dict[str, Any]:
        cfg = XbtConfig(pretrain_steps=STEPS, pretrain_batch_size=16, steps=STEPS,
                        batch_size=16, lora_dropout=0.0, anchor=True, pair_anchor=True,
                        seed=7, select_every=4)
        return {"old": old, "new": micro_model(32), "corpus": "synth:64", "pairs": data,
                "out": out, "cfg": cfg, "version_id": out.name, "show_progress": False,
                "checkpoint_dir": checkpoints, "checkpoint_every": 4 if checkpoints else 0}

    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(RankFailed, match="stopped at xbt stage 2"):
        launch(upgrade_stopped_at, (kwargs(tmp_path / "resumed", checkpoints),
                                    ("stage 2", 6)), gpus=2, device="cpu", threads=1)
    assert (checkpoints / "stage2" / "train_state.pt").is_file()
    assert not (tmp_path / "resumed").exists()
    seen: list[Any] = []
    run_ranks(2, upgrade, kwargs(tmp_path / "resumed", checkpoints), device="cpu", threads=1,
              on_progress=seen.append)
    metrics = load_artifact(tmp_path / "resumed").manifest["metrics"]
    assert metrics["pretrain"]["resumed_from"] == STEPS  # stage 1 was done: not run again
    assert metrics["stage2"]["resumed_from"] == 4  # from the last save, not from scratch
    assert all(p.stage == "xbt stage 2 (pairs)" and p.step > 4 for p in seen)
    run_ranks(2, upgrade, kwargs(tmp_path / "whole", None), device="cpu", threads=1)
    whole, resumed = (load_artifact(tmp_path / name) for name in ("whole", "resumed"))
    a, b = artifact_tensors(whole), artifact_tensors(resumed)
    assert a.keys() == b.keys() and a
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    assert whole.manifest["metrics"]["selection"]["curve"] == \
        resumed.manifest["metrics"]["selection"]["curve"]
