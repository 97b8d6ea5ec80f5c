"""The plan's record from measured options: the table, the migration's curve, the
recommendation and why (``make_plan``), JSON-ready."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.upgrades.plan.decide import Constraints, Scored, recommend
from training.upgrades.plan.measure import GRID, Option, Scorer


@dataclass
class Costs:
    """What compute costs on this host: NEW's measured rate over the gallery's size."""

    gallery_items: int
    sample_items: int
    sample_seconds: float  # NEW embedding the sample's sources (read, decode, forward)

    @property
    def item_seconds(self) -> float:
        return self.sample_seconds / max(1, self.sample_items)

    @property
    def backfill_seconds(self) -> float:
        """A full backfill: every item of the gallery re-embedded at the sample's rate."""
        return self.item_seconds * self.gallery_items

    def fraction(self, seconds: float) -> float:
        return seconds / self.backfill_seconds if self.backfill_seconds > 0 else float("inf")

    def describe(self) -> dict[str, Any]:
        rate = self.sample_items / self.sample_seconds if self.sample_seconds > 0 else None
        return {"items": self.gallery_items, "items_per_s": _r(rate),
                "seconds": _r(self.backfill_seconds), "hours": _r(self.backfill_seconds / 3600),
                "measured_on": f"the sample: {self.sample_items} items in "
                               f"{self.sample_seconds:.2f} s"}


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None or not np.isfinite(v) else round(float(v), digits)


def _shares(scorer: Scorer, hits: dict[str, np.ndarray]) -> dict[str, dict[str, float | None]]:
    """Each direction's share of the gain and its error, rounded for the record."""
    return {d: {k: _r(v) for k, v in sh.items()} for d, sh in scorer.shares(hits).items()}


def _worst(values: dict[str, float] | None) -> float | None:
    return None if not values else max(values.values())


def time_averaged(scorer: Scorer, option: Option, horizon: float) -> tuple[float, np.ndarray]:
    """The option's score averaged over time from the start of the migration to
    ``horizon`` (compute, in full backfills: every migration of the plan has ended by
    then), with its draws. Time includes the option's own fits (``overhead_fraction``),
    during which what served before the migration (``before``: the route) still serves,
    its score held over the whole overhead (the migration's side does not exist until
    its fits end, so it is not credited then, even where it would beat the route at its
    first fraction); then the served curve over the backfill (``served``, trapezoid);
    after its backfill, its final side. So a migration that needs a fit first is weighed
    by when its gain arrives, not by how many items it had re-embedded."""
    served = option.served
    assert served is not None
    fractions = sorted(served)
    start = option.overhead_fraction
    end = max(horizon, start + fractions[-1])
    timeline = {start: served[fractions[0]]}
    timeline.update({start + f: served[f] for f in fractions})
    timeline[end] = served[fractions[-1]]
    value, draws = scorer.area(timeline)  # from the backfill's start on
    if start > 0:
        if option.before is None:
            raise ValueError(f"option {option.name!r} has an overhead of {start:g} backfills "
                             f"but no record of what serves meanwhile (its before)")
        held, held_draws = scorer.score(option.before)
        value, draws = value + start * held, draws + start * held_draws
    return value / end, draws / end


def make_plan(options: Sequence[Option], scorer: Scorer, costs: Costs,
              constraints: Constraints, old_hits: dict[str, np.ndarray],
              new_hits: dict[str, np.ndarray]) -> dict[str, Any]:
    """``{"options": [...], "curve": {...}, "recommendation": {...}, "baseline", "backfill"}``."""
    from training.upgrades.transform.simulate import negative_flip

    rows, scored = [], []
    no_gain = [d for d, g in scorer.gain.items() if g <= 0]
    horizon = max((1.0 + o.overhead_fraction for o in options if o.served is not None),
                  default=1.0)
    for o in options:
        row: dict[str, Any] = {
            "name": o.name, "kind": o.kind, "label": o.label, "measured": o.measured,
            "note": o.note, "applicable": o.apply is not None, "apply": o.apply,
            "compute": {"fraction": _r(o.compute_fraction), "seconds": _r(o.compute_seconds, 2),
                        "hours": _r(o.compute_seconds / 3600, 6)},
            "added_latency_ms": ({k: _r(v, 3) for k, v in o.added_latency_ms.items()}
                                 if o.added_latency_ms else None),
            "storage": o.storage}
        sc = o.scorer or scorer
        own_gain = all(g > 0 for g in sc.gain.values())
        scoreable = o.measured and o.hits is not None and not no_gain
        if scoreable and not own_gain:
            row["note"] = (f"{o.note}; " if o.note else "") + (
                "the new model gains nothing on the items it was simulated on: no share")
        s = Scored(o.name, o.compute_fraction, o.compute_seconds / 3600,
                   _worst(o.added_latency_ms), None, o.measured and own_gain)
        if scoreable and own_gain:
            both = {"old->old": sc.old, "x": o.hits}
            flips = {d: negative_flip(both, "x", "old->old", d) for d in o.hits}
            if o.served is not None:  # a migration: the worst point it serves (its
                # overhead's included: what served before it serves then)
                points = list(o.served.values()) + (
                    [o.before] if o.before is not None and o.overhead_fraction > 0 else [])
                flips = {d: max(negative_flip({"old->old": sc.old, "x": h}, "x", "old->old", d)
                                for h in points) for d in o.hits}
            s.negative_flip = max(flips.values())
            s.score, s.draws = sc.score(o.hits)
            row.update({"R@1": {d: _r(float(h.mean())) for d, h in o.hits.items()},
                        "share": _shares(sc, o.hits),
                        "score": _r(s.score), "negative_flip": {d: _r(v) for d, v in
                                                                flips.items()}})
            if o.served is not None:
                s.area, s.area_draws = time_averaged(sc, o, horizon)
                row.update({"mean_share_during": _r(s.area), "horizon": _r(horizon),
                            "switch_at": o.switch_at,
                            "overhead_fraction": _r(o.overhead_fraction),
                            "curve": [{"fraction": f, "compute": _r(o.overhead_fraction + f),
                                       **{d: {k: _r(v) for k, v in sh.items()} for d, sh in
                                          sc.shares(o.served[f]).items()}}
                                      for f in sorted(o.served)]})
            if o.kept is not None:  # its end: the native side alone, or both kept
                row["end"] = {
                    "native": _shares(sc, o.hits), "kept": _shares(sc, o.kept),
                    "native_below_kept": o.native_below_kept,
                    "kept_storage": {"gallery_bytes": 2 * int(o.storage.get("gallery_bytes", 0))},
                    "note": (f"at its end the native side alone is below {o.name} with both "
                             f"sides kept, beyond the error (one-sided 5%): the migration "
                             f"does not switch by itself; the operator switches (the native "
                             f"side alone) or keeps both sides (twice the vectors, two "
                             f"embeddings per write)" if o.native_below_kept else
                             f"at its end the native side alone is not below {o.name} with "
                             f"both sides kept beyond the error: it switches")}
            if o.side is not None:  # the side as it stands (served from the switch on)
                row["side_curve"] = [{"fraction": f, **{
                    d: {k: _r(v) for k, v in sh.items()} for d, sh in
                    sc.shares(o.side[f]).items()}} for f in sorted(o.side)]
        scored.append(s)
        rows.append(row)
    decision = recommend(scored, constraints)
    if no_gain:
        decision = {**decision, "option": None, "rejected": {}, "why": (
            f"the new model is no better than the old one on the validation set "
            f"({', '.join(no_gain)}): there is no gain to recover; keep the current version")}
    for row in rows:
        row["recommended"] = row["name"] == decision["option"]
        row["why_not"] = decision["rejected"].get(row["name"])
    # the curve drawn through the chart: the recommended migration's, else the one that
    # delivers the most while it runs
    migrations = [r for r in rows if r.get("curve")]
    best_curve = next((r for r in migrations if r["recommended"]), None) or max(
        migrations, key=lambda r: r.get("mean_share_during") or -1.0, default=None)
    return {"options": rows, "recommendation": {k: v for k, v in decision.items()
                                                if k != "rejected"},
            "curve": ({"option": best_curve["name"], "points": best_curve["curve"],
                       "switch_at": best_curve["switch_at"]} if best_curve else None),
            "objective": scorer.objective, "fractions": list(GRID),
            "baseline": {"old->old": {d: _r(float(h.mean())) for d, h in old_hits.items()},
                         "new->new": {d: _r(float(h.mean())) for d, h in new_hits.items()}},
            "backfill": costs.describe()}
