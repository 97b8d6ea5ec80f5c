"""The plan's recommendation: the option with the largest gain that fits the operator's
constraints, chosen so that noise does not decide.

Among the options that fit, taken from the cheapest (compute as a fraction of a full
backfill; ties: the order they are listed), the choice moves to a dearer option only when
a one-sided paired test says it beats the current choice: its score (the objective: by
default the lower of the two directions' shares of the gain) leads by more than
``z(1 - level)`` times the standard error of the difference (a paired bootstrap over the
validation items, ``training.upgrades.transform.simulate.one_sided``). Options that end
as high (neither beats the other so) are told apart the same way by the gain they
deliver while they run (the score averaged over the backfill; every migration ends at
the new model's full gain).

The false-pick rate: each of the ``m`` tests the chain can run (one per dearer option,
one more for each dearer option that could be told apart by its gain while it runs) is
at ``alpha / m`` (Bonferroni). A false pick needs some test to say "beats" where the
dearer option is no better; by the union bound that happens with probability at most
``alpha`` (5%) over the whole chain. The same test picks XBT's stage-2 checkpoint
(``training.upgrades.xbt.selection``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from training.errors import ConfigError
from training.upgrades.transform.simulate import ALPHA, one_sided, z_bound

RULE = ("among the options that fit the constraints, from the cheapest: a dearer option is "
        "chosen only when a one-sided paired bootstrap test (over the validation items) says "
        "its score beats the choice so far; options that end as high are decided the same way "
        "by the score averaged over the backfill; each of the m tests the chain can run is at "
        "5%/m (Bonferroni), so a dearer option of no greater true gain is picked at most 5% of "
        "the time")


@dataclass(frozen=True)
class Constraints:
    """What the operator allows (None: no limit)."""

    max_added_latency_ms: float | None = None  # per query, over the old model's own
    max_negative_flip: float | None = None  # per direction, against old->old
    budget: float | None = None  # compute, as a fraction of a full backfill
    budget_gpu_hours: float | None = None  # compute in hours of this host's device

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and (not np.isfinite(value) or value < 0):
                raise ConfigError(f"constraint {name} must be a number >= 0, got {value}")
        if self.max_negative_flip is not None and self.max_negative_flip > 1:
            raise ConfigError(f"max_negative_flip is a rate in [0, 1], got "
                              f"{self.max_negative_flip}")

    def violations(self, o: Scored) -> list[str]:
        out = []
        if self.budget is not None and o.compute_fraction > self.budget + 1e-12:
            out.append(f"compute {o.compute_fraction:.3g} of a full backfill > budget "
                       f"{self.budget:g}")
        if self.budget_gpu_hours is not None and o.gpu_hours > self.budget_gpu_hours + 1e-12:
            out.append(f"{o.gpu_hours:.3g} device-hours > budget {self.budget_gpu_hours:g}")
        if (self.max_added_latency_ms is not None and o.added_latency_ms is not None
                and o.added_latency_ms > self.max_added_latency_ms + 1e-12):
            out.append(f"adds {o.added_latency_ms:.2f} ms per query > "
                       f"{self.max_added_latency_ms:g} ms")
        if (self.max_negative_flip is not None and o.negative_flip is not None
                and o.negative_flip > self.max_negative_flip + 1e-12):
            out.append(f"negative flip {o.negative_flip:.4f} > {self.max_negative_flip:g}")
        return out


@dataclass
class Scored:
    """What the choice reads of an option."""

    name: str
    compute_fraction: float
    gpu_hours: float
    added_latency_ms: float | None  # the larger of text and image
    negative_flip: float | None  # the larger of the two directions
    measured: bool
    score: float | None = None
    draws: np.ndarray | None = None
    area: float | None = None  # a migration: the score averaged over the backfill
    area_draws: np.ndarray | None = None


def _se(a: np.ndarray | None, b: np.ndarray | None) -> float:
    """The bootstrap standard error of ``a - b`` (paired draws; 0 without draws)."""
    if a is None or b is None:
        return 0.0
    diff = a - b
    ok = diff[np.isfinite(diff)]
    return float(ok.std(ddof=1)) if len(ok) > 1 else 0.0


@dataclass(frozen=True)
class Level:
    """The per-test level of a chain of ``tests`` one-sided tests at family level
    ``alpha`` (Bonferroni), and how each reason says it."""

    alpha: float
    tests: int

    @property
    def each(self) -> float:
        return self.alpha / max(1, self.tests)

    def says(self, se: float) -> str:
        return (f"one-sided test at {self.alpha:.0%}: lead > {z_bound(self.each):.2f} x error "
                f"{se:.3f}, {self.tests} test{'s' if self.tests != 1 else ''} at "
                f"{self.each:.2%} each")


def comparison_level(alpha: float, k: int, compared: int | None = None) -> float:
    """The level of the ``k``-th (from 1) one-sided test of a chain whose family-wise
    false-pick rate is ``alpha``: ``alpha / compared`` when the chain's length is known
    (Bonferroni), else ``alpha / (k (k + 1))``, levels that sum to ``alpha`` over any
    number of tests (a chain that does not know its length in advance: XBT's
    checkpoints)."""
    if compared is not None:
        return alpha / max(1, compared)
    return alpha / (k * (k + 1))


def chain_tests(fit: list[Scored]) -> int:
    """How many tests the chain over ``fit`` (cheapest first) can run: one per dearer
    option, and one more where a dearer option with a curve may end as high as a cheaper
    one with a curve (the tie-break by the gain while it runs)."""
    tests = 0
    for n, o in enumerate(fit[1:], 1):
        tests += 1 + int(o.area is not None and any(p.area is not None for p in fit[:n]))
    return tests


def _fitting(options: list[Scored], constraints: Constraints,
             ) -> tuple[list[Scored], dict[str, str]]:
    """(the measured options that fit, cheapest first; the others with why not)."""
    rejected: dict[str, str] = {}
    fit: list[tuple[int, Scored]] = []
    for n, o in enumerate(options):
        if not o.measured or o.score is None:
            rejected[o.name] = "not measured (estimated cost only)"
            continue
        broken = constraints.violations(o)
        if broken:
            rejected[o.name] = "; ".join(broken)
        else:
            fit.append((n, o))
    fit.sort(key=lambda pair: (pair[1].compute_fraction, pair[0]))
    return [o for _, o in fit], rejected


def _compare(best: Scored, o: Scored, level: Level, rejected: dict[str, str]) -> Scored:
    """The choice after the dearer ``o`` meets the choice so far ``best``; the one left
    out gets its reason in ``rejected``."""
    assert o.score is not None and best.score is not None
    se = _se(o.draws, best.draws)
    lead = o.score - best.score
    if one_sided(lead, se, level.each):
        rejected[best.name] = (f"{o.name} gains more: {o.score:.3f} against {best.score:.3f}, "
                               f"beyond the error ({level.says(se)})")
        return o
    if one_sided(-lead, se, level.each) or o.area is None or best.area is None:
        rejected[o.name] = (f"not better than the cheaper {best.name} beyond the error: "
                            f"{o.score:.3f} against {best.score:.3f} ({level.says(se)})")
        return best
    area_se = _se(o.area_draws, best.area_draws)
    if one_sided(o.area - best.area, area_se, level.each):
        rejected[best.name] = (f"{o.name} ends as high (neither beats the other beyond the "
                               f"error {se:.3f}) and delivers more while it runs: "
                               f"{o.area:.3f} against {best.area:.3f} averaged over the "
                               f"backfill, beyond the error ({level.says(area_se)})")
        return o
    rejected[o.name] = (f"ends as high as the cheaper {best.name} and delivers no more while "
                        f"it runs beyond the error: {o.area:.3f} against {best.area:.3f} "
                        f"averaged over the backfill ({level.says(area_se)})")
    return best


def recommend(options: list[Scored], constraints: Constraints,
              alpha: float = ALPHA) -> dict[str, Any]:
    """``{"option", "why", "rejected": {name: reason}, "rule", "constraints", "alpha"}``;
    ``option`` None when nothing measured fits (every reason then says why). ``alpha``:
    the chain's false-pick rate (module docstring)."""
    fit, rejected = _fitting(options, constraints)
    base = {"rule": RULE, "constraints": asdict(constraints), "alpha": alpha}
    if not fit:
        return {**base, "option": None, "rejected": rejected,
                "why": "no measured option fits the constraints"}
    level = Level(alpha, chain_tests(fit))
    best = fit[0]
    for o in fit[1:]:
        best = _compare(best, o, level, rejected)
    assert best.score is not None
    why = (f"{best.name}: the largest gain that fits ({best.score:.3f}, compute "
           f"{best.compute_fraction:.3g} of a full backfill)")
    return {**base, "option": best.name, "why": why, "rejected": rejected}
