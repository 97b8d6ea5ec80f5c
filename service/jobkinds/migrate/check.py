"""The check after a progressive switch, and the rule that switches a gallery back.

A progressive migration serves its new side before the backfill ends (the transform's
validation curve says from which fraction: ``transform.validation_curve``). From then on
the gateway measures the side again each time the share of items re-embedded has grown
by ``CHECK_EVERY`` since the last look (``live_check``): the validation items as they
stand at that fraction (as the curve simulated them) among ``LIVE_DISTRACTORS`` items
read from the gallery's own two sides now, against the route that would serve instead.
Below the route beyond the error in a served direction: the gallery switches back.

**The rate of a false switch back.** Each look is a one-sided paired test: the route's
R@1 lead over the side beyond ``z(1 - level)`` times the lead's standard error if the two
were equally good, an image with its captions as one unit (``simulate.falls_below``). A
test at 5% at every look would switch back a side exactly as good as the route far more
often than 5% over the whole migration (every look and every served direction is another
chance). So the looks of one migration share one budget, ``SWITCH_BACK_ALPHA`` (5%),
spent in proportion to the backfill (``look_level``): the look at fraction ``f``, after
the previous look (or the switch) at ``f'``, tests at ``alpha * (f - f') / (1 - f0)``
(``f0``: where the gallery switched), split evenly over the directions the gallery
serves. The fractions only grow and end at 1, so these levels add up to at most
``alpha`` over the migration, however many looks there are and however they are spaced;
by the union bound, the probability that a side as good as the route is switched back
at least once over the whole migration is at most 5%, whatever the correlation between
the looks. At looks every 5% this is Bonferroni: ``alpha / K`` per look, with at most
``K = (1 - f0) / 0.05`` looks (20 after a switch at 0, 19 after one at 1%, 17 at 15%),
halved per direction where the gallery serves both. Each recorded check says its level,
the budget spent so far, its look and how many looks there can be.

**Small levels.** Nothing is resampled: the error is computed from the units
(``simulate.null_lead``: the spread of the lead when each unit's difference is as likely
taken with either sign, the clustered McNemar test), so a level of 0.05 / 40 only moves
the bound (2.02 -> 3.02 errors) and needs no bootstrap draws to estimate a tail. The
curve's bootstrap error is the spread around the observed lead instead; it shrinks as the
lead grows (by about ``sqrt(1 - z^2 / U)`` at the bound, for ``U`` units), which at such a
level on 100 to 300 single-query units makes a test reject 1.2 to 1.4 times as often as
its level, and the levels would no longer add up to the rate they promise.

``tests/test_switch_back_rate.py`` simulates migrations whose side is exactly as good as
the route, looked at after every 5% as the gateway does, and checks the rate stays
within 5% (and that a test at 5% per look exceeds it), and that a side 10 points of R@1
below the route is switched back. Measured there (300 images with 5 captions, switched
at 0, 20 looks): 1.95% of 2,000 such migrations switched back (a test at 5% per look:
41%); 3.0% of 1,000 on 100 images whose side answers anew at every look; a side 10
points below switched back in all of 400 (84.5% serving image->text alone).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from service.jobkinds.migrate.transform import LISTING, VALIDATION

SWITCH_BACK_ALPHA = 0.05  # P(at least one false switch back over a migration), at most
CHECK_EVERY = 0.05  # the growth of the re-embedded share between two looks
LIVE_DISTRACTORS = 2000  # gallery items a check after the switch reads from both sides
SWITCH_BACK_RULE = (
    "switch back when the side is below the route beyond the paired error in a served "
    "direction (one-sided paired test, the lead's error if the two were equal, items as "
    "units) at a look; the looks of one "
    f"migration share a {SWITCH_BACK_ALPHA:.0%} budget, spent in proportion to the "
    "backfill since the switch and split over the served directions, so a side as good "
    f"as the route is switched back at most {SWITCH_BACK_ALPHA:.0%} of the time")


def look_level(fraction: float, previous: float, switched_at: float, directions: int = 1,
               alpha: float = SWITCH_BACK_ALPHA) -> float:
    """The level of one direction's test at the look at ``fraction`` of the backfill,
    after the previous look (or the switch) at ``previous``, for a gallery switched at
    ``switched_at`` that serves ``directions`` directions: ``alpha`` spent in proportion
    to the backfill, ``alpha * (fraction - previous) / (1 - switched_at) / directions``.
    Over any looks at growing fractions up to 1 the levels add up to at most ``alpha``."""
    span = 1.0 - switched_at
    step = min(fraction, 1.0) - max(previous, switched_at)
    if span <= 0:
        raise ValueError(f"a gallery switched at {switched_at:g} has no backfill left to look at")
    if step <= 0:
        raise ValueError(f"a look at {fraction:g} after one at {previous:g}: the backfill "
                         "has not grown, there is no level to spend")
    if directions < 1:
        raise ValueError(f"a look tests at least one direction, got {directions}")
    return alpha * step / span / directions


def looks_at_most(switched_at: float, every: float = CHECK_EVERY) -> int:
    """How many looks a migration switched at ``switched_at`` can have, one each time the
    backfill has grown by ``every``."""
    return max(0, math.floor((1.0 - switched_at) / every + 1e-6))


def switches_back(hits: Mapping[str, Mapping[str, np.ndarray]],
                  units: Mapping[str, np.ndarray] | None, served: Sequence[str],
                  fraction: float, previous: float, switched_at: float,
                  alpha: float = SWITCH_BACK_ALPHA) -> tuple[bool, float]:
    """(whether the look at ``fraction`` switches back, the level each direction was
    tested at): ``hits["side"]`` below ``hits["routed"]`` beyond the error in a direction
    of ``served`` (``falls_below``), each tested at ``look_level``."""
    from training.upgrades.transform.simulate import falls_below

    level = look_level(fraction, previous, switched_at, len(served), alpha)
    return falls_below(hits, "side", "routed", served, units, alpha=level), level


def live_check(store: Any, record: Any, work: Path, fraction: float, *, seed: int,
               switched_at: float, checks: Sequence[Mapping[str, Any]] = (),
               ) -> dict[str, Any] | None:
    """The side as it stands, measured again after a progressive switch (at
    ``switched_at``): the validation items at ``fraction`` of their order (as the curve
    simulated them) among distractors read from the gallery's own sides now (up to
    ``LIVE_DISTRACTORS`` listed items, drawn with ``seed``: their vectors on the target
    side, transformed or re-embedded as they are, and on the source side for the route),
    against the route. ``work``: the folder holding the migration's ``validation.npz``
    and ``listing.json``; ``store``: the gallery store (``vectors``); ``checks``: the
    checks recorded since the switch, oldest first (the last one's fraction is where the
    budget was spent to). ``below``: the side is below the route beyond the error in a
    served direction, each tested at ``look_level``. None when the curve's inputs are not
    there (no validation set): nothing is spent."""
    from training.upgrades.transform.simulate import DIRECTIONS, done_mask, top1_hits

    path = work / VALIDATION
    if not path.exists():
        return None
    with np.load(path) as data:
        saved = {k: data[k] for k in data.files}
    meta = json.loads(bytes(saved["meta"]).decode())
    served = meta["served"]
    fraction = round(fraction, 4)  # as recorded: the next look spends from it
    previous = float(checks[-1]["fraction"]) if checks else float(switched_at)
    look_level(fraction, previous, switched_at, len(served))  # refused before any read
    m = record.migration
    listed = [i["id"] for i in json.loads((work / LISTING).read_text())]  # not a scroll
    ids = _drawn(listed, LIVE_DISTRACTORS, seed)
    target = store.vectors(m.target.collection, ids)
    source = store.vectors(m.source.collection, ids)
    hits: dict[str, dict[str, np.ndarray]] = {"side": {}, "routed": {}}
    for d in served:
        qk, ik = DIRECTIONS[d]
        both = [i for i in ids if ik in target.get(i, {}) and ik in source.get(i, {})]
        mask = done_mask(saved[f"order_{ik}"], meta["n_items"], fraction)
        side = np.where(mask[:, None], saved[f"item_new_{ik}"], saved[f"item_transformed_{ik}"])
        rel = np.concatenate([saved[f"relevant_{d}"],
                              np.zeros((len(saved[f"relevant_{d}"]), len(both)), bool)], 1)
        side_rows = np.concatenate([side, _rows(target, both, ik, side.shape[1])])
        route_rows = np.concatenate([saved[f"item_old_{ik}"],
                                     _rows(source, both, ik, saved[f"item_old_{ik}"].shape[1])])
        hits["side"][d] = top1_hits(saved[f"query_new_{qk}"] @ side_rows.T, rel)
        hits["routed"][d] = top1_hits(saved[f"query_routed_{qk}"] @ route_rows.T, rel)
    units = {d: saved[f"units_{d}"] for d in served}
    below, level = switches_back(hits, units, served, fraction, previous, switched_at)
    r1 = {d: {"side": round(float(hits["side"][d].mean()), 4),
              "routed": round(float(hits["routed"][d].mean()), 4)} for d in served}
    look, most = len(checks) + 1, looks_at_most(switched_at)
    spent = SWITCH_BACK_ALPHA * (min(fraction, 1.0) - switched_at) / (1.0 - switched_at)
    why = "; ".join(f"{d}: side {v['side']:.3f} against the route {v['routed']:.3f}"
                    for d, v in r1.items())
    why += (f"; one-sided test at {level:.3%} per direction, look {look} of at most {most}, "
            f"{SWITCH_BACK_ALPHA:.0%} over the migration")
    return {"fraction": fraction, "below": bool(below), "R@1": r1, "why": why,
            "distractors": len(ids), "level": round(level, 7), "look": look,
            "looks_at_most": most, "spent": round(spent, 6),
            "overall_level": SWITCH_BACK_ALPHA}


def _drawn(listed: list[str], k: int, seed: int) -> list[str]:
    names = sorted(listed)
    picked = np.random.default_rng(seed).permutation(len(names))[:k]
    return [names[n] for n in sorted(picked.tolist())]


def _rows(vectors: dict[str, dict[str, np.ndarray]], ids: list[str], kind: str,
          dim: int) -> np.ndarray:
    if not ids:
        return np.zeros((0, dim), np.float32)
    return np.stack([np.asarray(vectors[i][kind], np.float32) for i in ids])
