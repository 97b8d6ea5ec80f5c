"""Validation-selected stage 2 (``XbtConfig.select_every``): which checkpoint of stage 2 ships.

Stage 2 may undo what stage 1 won (issue 24), so the route it ends with is not shipped
blindly. Every ``select_every`` steps, and at its last step, the current route (the new
model with its adapters, then phi) embeds a validation split and is scored new->old
against the OLD version's embeddings of the same split, which stage 1 cached while the
old model was loaded (stage 2 never holds it). Step 0 is stage 1 alone: phi as stage 1
left it, on the off-the-shelf new model (adapters off). The best checkpoint's adapter and
phi state (copied in memory) is put back at the end, so the artifact's route is the
chosen one; the curve and the chosen step go into the artifact's metrics.

Best (``SCORE``): the mean of text->image and image->text R@1, among the checkpoints no
worse than step 0 in either direction (step 0 always qualifies). A later checkpoint
replaces the best so far only when a one-sided paired test says it is better: its lead
exceeds ``z(1 - level)`` times the standard error of the difference, a bootstrap over the
validation items (an image with its captions, ``paired_score_se``), the plan's own
rule (``training.upgrades.plan.decide``). The levels keep the chance that any checkpoint
no better than the one it replaces ships at most 5% over the whole curve: 5% / the number
of comparisons when it is known (``compared``), else 5% / (k (k + 1)) for the k-th (they
sum to 5%). A validation split of a few hundred queries moves R@1 by a few hundredths
between draws, and a checkpoint that wins by less than that is as likely worse on held-out
data (``bench xbt --seed 2`` shipped such a stage 2, worse than its own stage 1 on the test
set). So the earlier, cheaper route ships unless the later one is better beyond noise; a
selected route never trades a loss against stage 1 in one direction for a gain in the
other, and a stage 2 that did not clearly help ships as stage 1 alone.

The validation split is never the test set: the caller gives one (``upgrade(...,
validation=)``, the bench's own draw), or ``prepare`` holds ``select_holdout`` of the paired
set out of training (``hold_out``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from training.data import PairDataset
from training.encoders import Encoder
from training.errors import DataError
from training.evaluate import cross_top1_hits
from training.pairs import PairTensors
from training.upgrades.plan.decide import comparison_level
from training.upgrades.transform.simulate import ALPHA, UnitDraws, z_bound
from training.upgrades.xbt.adapters import Adapters
from training.upgrades.xbt.projector import Projector, ProjectorHead

SCORE = ("mean of t2i and i2t R@1 new->old on the validation split, among the checkpoints "
         "no worse than step 0 (stage 1 alone) in either direction; a later checkpoint "
         "replaces the best so far only when a one-sided paired test (a bootstrap over the "
         "validation items) says it is better: its lead exceeds the margin, z x the "
         "standard error of the difference, at a level that keeps the chance of shipping a "
         "checkpoint no better than the one it replaced at most 5% over the curve")
GIVEN, HELD_OUT = "given", "held out of the paired set"


@dataclass
class ValidationSet:
    """The split stage 2's checkpoints are scored on: the new model's inputs, and (once
    stage 1 has cached them, ``with_old``) the old version's embeddings of it."""

    dataset: PairDataset  # the images, for an old version with other preprocessing
    pairs: PairTensors  # the new model's preprocessing and tokens
    relevance: np.ndarray  # bool [M captions, N images]
    tokenizer: Callable[..., torch.Tensor]  # the new model's
    source: str  # GIVEN or HELD_OUT
    old_images: torch.Tensor | None = None  # [N, D_old] by the old version (stage 1)
    old_texts: torch.Tensor | None = None  # [M, D_old]

    def with_old(self, images: torch.Tensor, texts: torch.Tensor) -> ValidationSet:
        return replace(self, old_images=images, old_texts=texts)

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "images": len(self.pairs.pixels),
                "captions": len(self.pairs.captions)}


def hold_out(dataset: PairDataset, share: float, seed: int) -> tuple[PairDataset, PairDataset]:
    """(training part, held-out part): ``share`` of the records (at least one), drawn with
    ``seed``; both keep the dataset's order."""
    n = len(dataset)
    count = max(1, round(share * n))
    if n - count < 2:
        raise DataError(f"the paired set has {n} images: too few to hold {count} out for "
                        f"stage 2's validation (select_holdout={share}); give a validation "
                        f"set, or turn selection off with select_every=0")
    held = np.sort(np.random.default_rng(seed).permutation(n)[:count])
    keep = np.setdiff1d(np.arange(n), held)
    return dataset.subset(keep.tolist()), dataset.subset(held.tolist())


@dataclass
class Checkpoint:
    """One scored point of the curve; the best one also keeps its state."""

    step: int
    t2i: float
    i2t: float
    adapters: dict[str, torch.Tensor] | None = None  # None: adapters off (stage 1 alone)
    phi: dict[str, torch.Tensor] | None = None
    hits: dict[str, np.ndarray] | None = None  # per-query top-1: {"t2i": [M], "i2t": [N]}
    margin: float = 0.0  # the lead it had to exceed over the best so far (z x error)

    @classmethod
    def scored(cls, step: int, hits: dict[str, np.ndarray]) -> Checkpoint:
        return cls(step, float(hits["t2i"].mean()), float(hits["i2t"].mean()), hits=hits)

    @property
    def score(self) -> float:
        return (self.t2i + self.i2t) / 2

    def point(self) -> dict[str, Any]:
        return {"step": self.step, "t2i": self.t2i, "i2t": self.i2t, "score": self.score,
                "margin": self.margin}


def route_embeddings(model: torch.nn.Module, phi: Projector,
                     validation: ValidationSet) -> tuple[np.ndarray, np.ndarray]:
    """(images [N, D_old], captions [M, D_old]) of the validation split by the route as it
    is now (the model's adapters as they are switched, then phi), computed as the served
    route computes them (``Encoder`` with phi as its head)."""
    head = ProjectorHead(phi)
    encoder = Encoder(model, validation.tokenizer, next(model.parameters()).device,
                      text_head=head, image_head=head)
    return (encoder.encode_image_tensors(validation.pairs.pixels),
            encoder.encode_texts(validation.pairs.captions))


def route_hits(model: torch.nn.Module, phi: Projector,
               validation: ValidationSet) -> dict[str, np.ndarray]:
    """Per-query top-1 hits ``{"t2i": bool [M], "i2t": bool [N]}`` of the route as it is now
    against the old version's embeddings of the validation split (each mean is that
    direction's R@1)."""
    if validation.old_images is None or validation.old_texts is None:
        raise RuntimeError("the validation split has no old embeddings: stage 1 caches them")
    images, texts = route_embeddings(model, phi, validation)
    return cross_top1_hits(texts, images, validation.old_images.numpy(),
                           validation.old_texts.numpy(), validation.relevance)


class Selector:
    """Scores stage 1 alone (``stage1``), stage 2 at its checkpoints (``at_step``, the
    trainer's ``on_checkpoint``), then puts the best one back (``finish``)."""

    def __init__(self, validation: ValidationSet, adapters: Adapters, phi: Projector,
                 every: int, compared: int | None = None, alpha: float = ALPHA) -> None:
        """``compared``: how many later checkpoints will be compared (stage 2's steps /
        ``every``, rounded up), when known: each test is then at ``alpha / compared``."""
        self.validation, self.adapters, self.phi, self.every = validation, adapters, phi, every
        self.compared, self.alpha = compared, alpha
        self.curve: list[Checkpoint] = []
        self.best: Checkpoint | None = None
        self._draws: UnitDraws | None = None

    def stage1(self) -> None:
        """Step 0: phi as stage 1 left it on the off-the-shelf new model."""
        with self.adapters.disabled():
            self._consider(0, with_adapters=False)

    def at_step(self, step: int) -> None:
        self._consider(step, with_adapters=True)
        self.adapters.train_mode()  # scoring switched to eval mode; training goes on
        self.phi.train()

    def finish(self, last_step: int) -> dict[str, Any]:
        """Score the last step if no checkpoint fell on it, put the best state back into the
        adapters and phi (adapters switched off for step 0), and return the record."""
        if self.curve[-1].step != last_step:
            self._consider(last_step, with_adapters=True)
        best = self.best
        assert best is not None and best.phi is not None, "stage1() scores step 0 first"
        self.phi.load_state_dict(best.phi)
        if best.adapters is None:
            self.adapters.set_enabled(False)
        else:
            self.adapters.load_state_dict(best.adapters)
        return {"every": self.every, "score": SCORE, "validation": self.validation.describe(),
                "curve": [c.point() for c in self.curve], "chosen_step": best.step,
                "chosen": best.point(), "stage1": self.curve[0].point()}

    def state_dict(self) -> dict[str, Any]:
        """The curve so far and the best checkpoint with its state (saved with a resumable
        stage 2's state: a resumed run selects as the uninterrupted one would)."""
        best = self.best
        return {"curve": [[c.step, c.t2i, c.i2t, c.margin] for c in self.curve],
                "best": None if best is None else {
                    "step": best.step, "t2i": best.t2i, "i2t": best.i2t,
                    "margin": best.margin, "adapters": best.adapters, "phi": best.phi,
                    "hits": {k: torch.from_numpy(v) for k, v in (best.hits or {}).items()}}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A state saved before margins existed has 3-field points and no hits: it resumes
        # under the old rule (margin 0) rather than failing.
        self.curve = [Checkpoint(int(step), float(t2i), float(i2t),
                                 margin=float(margin[0]) if margin else 0.0)
                      for step, t2i, i2t, *margin in state["curve"]]
        best = state["best"]
        hits = (best or {}).get("hits") or None
        self.best = None if best is None else Checkpoint(
            int(best["step"]), float(best["t2i"]), float(best["i2t"]), best["adapters"],
            best["phi"], {k: v.numpy() for k, v in hits.items()} if hits else None,
            float(best.get("margin", 0.0)))

    def _consider(self, step: int, with_adapters: bool) -> None:
        point = Checkpoint.scored(step, route_hits(self.adapters.model, self.phi,
                                                   self.validation))
        if self.best is not None and self.best.hits is not None:
            level = comparison_level(self.alpha, len(self.curve), self.compared)
            se = paired_score_se(self.best.hits, point.hits or {}, self._drawn(point.hits))
            point.margin = z_bound(level) * se
        self.curve.append(point)
        if self.best is None or self._better(point, self.best):
            point.phi = {k: v.detach().clone() for k, v in self.phi.state_dict().items()}
            point.adapters = self.adapters.state_dict() if with_adapters else None
            self.best = point

    def _drawn(self, hits: dict[str, np.ndarray] | None) -> UnitDraws:
        """The validation items' bootstrap draws (made once: every comparison is scored on
        the same draws)."""
        if self._draws is None:
            self._draws = UnitDraws.joint(validation_units(self.validation, hits or {}))
        return self._draws

    def _better(self, point: Checkpoint, best: Checkpoint) -> bool:
        floor = self.curve[0]  # stage 1 alone
        return (point.t2i >= floor.t2i and point.i2t >= floor.i2t
                and point.score - best.score > point.margin)


def validation_units(validation: ValidationSet | None,
                     hits: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Direction -> [Q] the item each query belongs to: a caption's image (t2i) and an
    image itself (i2t), from one set of ids. Without a validation split (scores given
    directly) each query is its own item."""
    if validation is None:
        count = len(hits["t2i"])
        return {"t2i": np.arange(count), "i2t": count + np.arange(len(hits["i2t"]))}
    return {"t2i": validation.pairs.owner.numpy(), "i2t": np.arange(len(validation.pairs.pixels))}


def paired_score_se(before: dict[str, np.ndarray], after: dict[str, np.ndarray],
                    draws: UnitDraws) -> float:
    """The standard error of ``score(after) - score(before)`` (a score: the mean of the two
    directions' R@1) by a paired bootstrap over the validation items: each draw takes
    items with their image query and all their caption queries, for both sides."""
    total = np.mean([draws.means(d, after[d].astype(np.float64) - before[d].astype(np.float64))
                     for d in ("t2i", "i2t")], axis=0)  # [boot] the score's change per draw
    ok = total[np.isfinite(total)]
    return float(ok.std(ddof=1)) if len(ok) > 1 else 0.0
