"""The plan's recommendation: the option with the largest gain that fits the operator's
constraints, chosen so that noise does not decide.

Among the options that fit, taken from the cheapest (compute as a fraction of a full
backfill; ties: the order they are listed), the choice moves to a dearer option only when
its score (the objective: by default the lower of the two directions' shares of the
gain) beats the current choice's by more than the standard error of the difference (a
paired bootstrap over the validation queries). Options whose final score is within that
error (every migration ends at the new model's full gain) are told apart by the gain they
deliver while they run (the score averaged over the backfill), under the same rule. The
same rule picks XBT's stage-2 checkpoint (``training.upgrades.xbt.selection``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from training.errors import ConfigError

RULE = ("among the options that fit the constraints, from the cheapest: a dearer option is "
        "chosen only when its score beats the choice so far by more than the bootstrap "
        "standard error of the difference (paired over the validation queries); equal final "
        "scores within that error are decided by the score averaged over the backfill")


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
    if a is None or b is None:
        return 0.0
    diff = a - b
    ok = diff[np.isfinite(diff)]
    return float(ok.std(ddof=1)) if len(ok) > 1 else 0.0


def recommend(options: list[Scored], constraints: Constraints) -> dict[str, Any]:
    """``{"option", "why", "rejected": {name: reason}, "rule", "constraints"}``; ``option``
    None when nothing measured fits (every reason then says why)."""
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
    base = {"rule": RULE, "constraints": asdict(constraints)}
    if not fit:
        return {**base, "option": None, "rejected": rejected,
                "why": "no measured option fits the constraints"}
    fit.sort(key=lambda pair: (pair[1].compute_fraction, pair[0]))
    best = fit[0][1]
    for _, o in fit[1:]:
        assert o.score is not None and best.score is not None
        se = _se(o.draws, best.draws)
        lead = o.score - best.score
        if lead > se:
            rejected[best.name] = (f"{o.name} gains more: {o.score:.3f} against "
                                   f"{best.score:.3f}, beyond the error {se:.3f}")
            best = o
            continue
        if abs(lead) <= se and o.area is not None and best.area is not None:
            area_se = _se(o.area_draws, best.area_draws)
            if o.area - best.area > area_se:
                rejected[best.name] = (f"{o.name} ends as high (within {se:.3f}) and delivers "
                                       f"more while it runs: {o.area:.3f} against "
                                       f"{best.area:.3f} averaged over the backfill, beyond "
                                       f"the error {area_se:.3f}")
                best = o
                continue
            rejected[o.name] = (f"ends as high as the cheaper {best.name} and delivers no "
                                f"more while it runs beyond the error: {o.area:.3f} against "
                                f"{best.area:.3f} averaged over the backfill (error "
                                f"{area_se:.3f})")
            continue
        rejected[o.name] = (f"not better than the cheaper {best.name} beyond the error: "
                            f"{o.score:.3f} against {best.score:.3f} (error {se:.3f})")
    assert best.score is not None
    why = (f"{best.name}: the largest gain that fits ({best.score:.3f}, compute "
           f"{best.compute_fraction:.3g} of a full backfill)")
    return {**base, "option": best.name, "why": why, "rejected": rejected}

