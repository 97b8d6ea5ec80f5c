"""XBT's checkpoint selection under the plan's rule (``training.upgrades.xbt.selection``): a
later checkpoint ships only when a one-sided paired test over the validation items says it
is better, at levels that keep a false pick at most 5% over the whole curve."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import torch

from training.upgrades.xbt import selection

IMAGES, CAPTIONS = 100, 5


class StubRoute:
    """What the selector touches of the adapters and phi (the scores are scripted)."""

    model = None

    def disabled(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"w": torch.zeros(1)}

    def train_mode(self) -> None: ...

    def train(self) -> None: ...


def validation() -> SimpleNamespace:
    """What the selector reads of a validation split: its images and each caption's image."""
    owner = torch.arange(IMAGES).repeat_interleave(CAPTIONS)
    return SimpleNamespace(pairs=SimpleNamespace(owner=owner, pixels=torch.zeros(IMAGES, 1)))


def chosen(monkeypatch, curve: list[dict[str, np.ndarray]], split=None,
           compared: int | None = None) -> int:
    """The step a selector ships from a scripted curve (step 0 first)."""
    scripted = iter(curve)
    monkeypatch.setattr(selection, "route_hits", lambda *args: next(scripted))
    route = StubRoute()
    selector = selection.Selector(split, route, route, every=1,  # type: ignore[arg-type]
                                  compared=compared)
    selector.stage1()
    for step in range(1, len(curve)):
        selector.at_step(step)
    return selector.best.step


def per_item(images: np.ndarray) -> dict[str, np.ndarray]:
    """Hits of a route that answers each image's five captions as it answers the image."""
    return {"t2i": np.repeat(images, CAPTIONS), "i2t": images}


def test_a_checkpoint_ahead_by_caption_rows_but_not_by_items_does_not_ship(monkeypatch) -> None:
    """Nine images won and four lost (each with its five captions): beyond one error over
    the 600 queries as rows (the rule this replaced shipped it), not beyond the one-sided
    test over the 100 items; thirty won, none lost, ships."""
    stage1 = np.arange(IMAGES) % 2 == 0
    ahead = stage1.copy()
    ahead[np.flatnonzero(~stage1)[:9]] = True
    ahead[np.flatnonzero(stage1)[:4]] = False
    clear = stage1 | (np.arange(IMAGES) < 60)
    assert chosen(monkeypatch, [per_item(stage1), per_item(ahead)], validation()) == 0
    assert chosen(monkeypatch, [per_item(stage1), per_item(clear)], validation()) == 1


def equal_curve(rng: np.random.Generator, points: int) -> list[dict[str, np.ndarray]]:
    """Hits of ``points`` checkpoints of the same true quality: each image's probability
    drawn once; each checkpoint repeats a common outcome on 70% of the images, and a tenth
    of its captions answer apart from their image."""
    p = rng.beta(2, 2, IMAGES) * 0.6 + 0.2
    common = rng.random(IMAGES) < p
    curve = []
    for _ in range(points):
        own = np.where(rng.random(IMAGES) < 0.7, common, rng.random(IMAGES) < p)
        curve.append({"t2i": np.repeat(own, CAPTIONS) ^ (rng.random(IMAGES * CAPTIONS) < 0.1),
                      "i2t": own})
    return curve


def test_a_curve_of_checkpoints_no_better_than_stage1_ships_a_later_one_rarely(
        monkeypatch) -> None:
    """1,000 simulated stage 2s, five checkpoints after stage 1, every one of the same true
    quality (each agrees with a common outcome on 70% of the queries, and a tenth of the
    captions answer apart from their image): a later one ships at most 5% of the time.
    Not knowing the curve's length (levels 5% / (k (k + 1)): at most 4.2% over five) it
    measured 4.3%, 4.3% and 3.7% on seeds 0-2; knowing it (5% / 5 each) 4.0%, 4.6% and
    5.0%. The rule this replaced (a lead beyond one error over rows) shipped one 57% of
    the time."""
    rng = np.random.default_rng(0)
    split = validation()
    shipped = {None: 0, 5: 0}
    runs = 1000
    for _ in range(runs):
        curve = equal_curve(rng, 6)
        for compared in shipped:
            shipped[compared] += chosen(monkeypatch, curve, split, compared) != 0
    assert max(shipped.values()) / runs <= 0.05, shipped
