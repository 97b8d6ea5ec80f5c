"""The upgrade plan: every way to a new model measured on one gallery's own data, and a
recommendation under the operator's constraints that respects the noise of the measure.

- ``measure``: the options (query-side adapter routes with and without SLERP, an XBT
  version of the candidate, migrations with and without the gallery-side transform) scored
  on the embedded validation set, with bootstrap draws paired over the same queries.
- ``decide``: constraints, the noise-aware choice, and why each other option was not taken.
- ``build``: the plan's record (table, curve, recommendation); ``run``: a plan from models.
"""

from training.upgrades.plan.decide import Constraints, recommend
from training.upgrades.plan.measure import Embedded, Option, Scorer

__all__ = ["Constraints", "Embedded", "Option", "Scorer", "recommend"]
