"""The compatibility gate: may a candidate version serve a gallery that the incumbent serves?

The criterion is eq. 1 of the XBT paper, aggregated as R@1 (DESIGN.md, "Promotion is
gated"): on held-out validation data, the candidate's queries routed into the gallery's
space must retrieve the incumbent's gallery embeddings at least as well as the
incumbent's own queries do, text->image and image->text, plus a margin:

    R@1(candidate -> incumbent) >= R@1(incumbent -> incumbent) + margin

For a continual phase on a new domain, the items of the gallery's other (old) domains
are also checked alone: their R@1 may drop at most ``retention_limit`` (the new domain
must not buy its gain with the old ones).

For a phase that adds a language (TEIR), the new language plays the new domain's part:
its text->image R@1 (candidate text queries against the incumbent's image gallery) must
beat the incumbent's by ``margin``, and English, the language the gallery was served
in, may drop at most ``retention_limit`` in both directions. Only text->image is checked
for the new language: a gallery of images holds no text in it to retrieve.

Every report also carries the negative-flip rate per direction (BCT's regression-free
update, Yan et al. 2021 "Positive-Congruent Training"): the fraction of all validation
queries whose top-1 was relevant under incumbent->incumbent and is not under
candidate->incumbent, on the main validation set in the gate's language (English, the
retained one, in a language phase). A net R@1 gain can hide such regressions, so
``max_negative_flip`` (default off) adds one check per direction bounding it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from training.artifacts import Artifact
from training.compatibility import Embeddings, cell_top1_hits, compatibility_of_artifacts
from training.data import PairDataset
from training.errors import ConfigError
from training.evaluate import negative_flip_rate, positive_flip_rate

DIRECTIONS = ("t2i", "i2t")
METRIC = "R@1"


@dataclass(frozen=True)
class GateCriterion:
    margin: float = 0.0  # candidate->incumbent R@1 must beat incumbent->incumbent by this
    retention_limit: float | None = None  # largest allowed R@1 drop on old domains
    new_domain: str | None = None  # the phase's domain; the others are "old"
    new_language: str | None = None  # a language phase's language; English is "old"
    max_negative_flip: float | None = None  # largest allowed negative-flip rate; None: off

    def __post_init__(self) -> None:
        if not 0 <= self.margin <= 1:
            raise ConfigError(f"gate margin must be in [0, 1], got {self.margin}")
        if self.retention_limit is not None and not 0 <= self.retention_limit <= 1:
            raise ConfigError(f"retention_limit must be in [0, 1], got {self.retention_limit}")
        if self.max_negative_flip is not None and not 0 <= self.max_negative_flip <= 1:
            raise ConfigError(f"max_negative_flip must be in [0, 1], got {self.max_negative_flip}")
        if self.new_domain and self.new_language:
            raise ConfigError("a phase adds a domain or a language, not both")


def run_gate(candidate: Artifact, incumbent: Artifact, validation: PairDataset,
             criterion: GateCriterion | None = None, language: str = "en") -> dict[str, Any]:
    """The gate report: ``{"passed", "checks", "matrix", "criterion", "negative_flip",
    "positive_flip", "max_negative_flip", ...}`` (JSON-able); the flip rates are
    ``{"t2i": rate, "i2t": rate}`` of candidate->incumbent against incumbent->incumbent."""
    criterion = criterion or GateCriterion()
    if incumbent.space not in candidate.routes:
        raise ConfigError(f"candidate '{candidate.version_id}' has no route into the gallery's "
                          f"space '{incumbent.space}'; its routes: {sorted(candidate.routes)}")
    if criterion.new_language and criterion.new_language not in validation.languages():
        raise ConfigError(f"the validation set has no '{criterion.new_language}' captions, so "
                          f"the gate cannot measure the new language; its languages: "
                          f"{validation.languages()}")
    pair = [incumbent, candidate]
    embeddings: Embeddings = {}
    matrix = compatibility_of_artifacts(pair, validation, language, embeddings)
    flips = _flip_rates(embeddings, candidate, incumbent, validation.relevance(language))
    checks: list[dict[str, Any]] = []
    subset = f"language {language}" if criterion.new_language else "all"
    if criterion.new_language:
        checks += _language_checks(candidate, incumbent, validation, criterion)
        retained = -(criterion.retention_limit or 0.0)
        checks += _compatibility_checks(matrix, candidate.version_id, incumbent.version_id,
                                        retained, subset)
    else:
        checks += _compatibility_checks(matrix, candidate.version_id, incumbent.version_id,
                                        criterion.margin, subset)
    old_domains = _old_domains(validation, criterion.new_domain)
    if criterion.retention_limit is not None and old_domains:
        old = validation.filter(domains=old_domains)
        old_matrix = compatibility_of_artifacts(pair, old, language)
        checks += _compatibility_checks(old_matrix, candidate.version_id, incumbent.version_id,
                                        -criterion.retention_limit, "old domains")
    if criterion.max_negative_flip is not None:
        checks += _flip_checks(flips["negative"], criterion.max_negative_flip, subset)
    return {"passed": all(c["passed"] for c in checks), "checks": checks, "matrix": matrix,
            "criterion": {**asdict(criterion), "metric": METRIC, "old_domains": old_domains},
            "candidate": candidate.version_id, "incumbent": incumbent.version_id,
            "space": incumbent.space, "validation_items": len(validation),
            "negative_flip": flips["negative"], "positive_flip": flips["positive"],
            "max_negative_flip": criterion.max_negative_flip}


def _language_checks(candidate: Artifact, incumbent: Artifact, validation: PairDataset,
                     criterion: GateCriterion) -> list[dict[str, Any]]:
    """The new language's text->image check (run_gate made sure validation has it)."""
    language = str(criterion.new_language)
    matrix = compatibility_of_artifacts([incumbent, candidate], validation, language)
    checks = _compatibility_checks(matrix, candidate.version_id, incumbent.version_id,
                                   criterion.margin, f"language {language}")
    return [c for c in checks if c["direction"] == "t2i"]


def _compatibility_checks(matrix: dict[str, Any], candidate: str, incumbent: str,
                          margin: float, subset: str) -> list[dict[str, Any]]:
    """One check per direction: cross (candidate queries) against the incumbent's own."""
    cells = matrix["cells"]
    cross, own = cells[candidate][incumbent], cells[incumbent][incumbent]
    return [{"subset": subset, "direction": d, "new_to_old": cross[d][METRIC],
             "old_to_old": own[d][METRIC], "required": own[d][METRIC] + margin,
             "passed": cross[d][METRIC] >= own[d][METRIC] + margin - 1e-12}
            for d in DIRECTIONS]


def _flip_rates(embeddings: Embeddings, candidate: Artifact, incumbent: Artifact,
                relevance: np.ndarray) -> dict[str, dict[str, float]]:
    """Negative and positive flip rates per direction, from incumbent->incumbent (before)
    to candidate->incumbent (after), on the embeddings the matrix computed (PCT, Yan et al.)."""
    before = cell_top1_hits(embeddings, incumbent, incumbent, relevance)
    after = cell_top1_hits(embeddings, candidate, incumbent, relevance)
    return {"negative": {d: negative_flip_rate(before[d], after[d]) for d in DIRECTIONS},
            "positive": {d: positive_flip_rate(before[d], after[d]) for d in DIRECTIONS}}


def _flip_checks(negative: dict[str, float], limit: float, subset: str) -> list[dict[str, Any]]:
    """One check per direction: the negative-flip rate (``new_to_old``) at most ``limit``
    (``required``, an upper bound here; ``old_to_old`` does not apply)."""
    return [{"subset": subset, "direction": d, "name": f"negative flip {d} <= {limit:g}",
             "metric": "negative flip", "new_to_old": negative[d], "old_to_old": None,
             "required": limit, "passed": negative[d] <= limit + 1e-12}
            for d in DIRECTIONS]


def _old_domains(validation: PairDataset, new_domain: str | None) -> list[str]:
    if new_domain is None:
        return []
    return [d for d in validation.domains() if d != new_domain]
