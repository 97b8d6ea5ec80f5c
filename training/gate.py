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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from training.artifacts import Artifact
from training.compatibility import compatibility_of_artifacts
from training.data import PairDataset
from training.errors import ConfigError

DIRECTIONS = ("t2i", "i2t")
METRIC = "R@1"


@dataclass(frozen=True)
class GateCriterion:
    margin: float = 0.0  # candidate->incumbent R@1 must beat incumbent->incumbent by this
    retention_limit: float | None = None  # largest allowed R@1 drop on old domains
    new_domain: str | None = None  # the phase's domain; the others are "old"
    new_language: str | None = None  # a language phase's language; English is "old"

    def __post_init__(self) -> None:
        if not 0 <= self.margin <= 1:
            raise ConfigError(f"gate margin must be in [0, 1], got {self.margin}")
        if self.retention_limit is not None and not 0 <= self.retention_limit <= 1:
            raise ConfigError(f"retention_limit must be in [0, 1], got {self.retention_limit}")
        if self.new_domain and self.new_language:
            raise ConfigError("a phase adds a domain or a language, not both")


def run_gate(candidate: Artifact, incumbent: Artifact, validation: PairDataset,
             criterion: GateCriterion | None = None, language: str = "en") -> dict[str, Any]:
    """The gate report: ``{"passed", "checks", "matrix", "criterion", ...}`` (JSON-able)."""
    criterion = criterion or GateCriterion()
    if incumbent.space not in candidate.routes:
        raise ConfigError(f"candidate '{candidate.version_id}' has no route into the gallery's "
                          f"space '{incumbent.space}'; its routes: {sorted(candidate.routes)}")
    if criterion.new_language and criterion.new_language not in validation.languages():
        raise ConfigError(f"the validation set has no '{criterion.new_language}' captions, so "
                          f"the gate cannot measure the new language; its languages: "
                          f"{validation.languages()}")
    pair = [incumbent, candidate]
    matrix = compatibility_of_artifacts(pair, validation, language)
    checks: list[dict[str, Any]] = []
    if criterion.new_language:
        checks += _language_checks(candidate, incumbent, validation, criterion)
        retained = -(criterion.retention_limit or 0.0)
        checks += _compatibility_checks(matrix, candidate.version_id, incumbent.version_id,
                                        retained, f"language {language}")
    else:
        checks += _compatibility_checks(matrix, candidate.version_id, incumbent.version_id,
                                        criterion.margin, "all")
    old_domains = _old_domains(validation, criterion.new_domain)
    if criterion.retention_limit is not None and old_domains:
        old = validation.filter(domains=old_domains)
        old_matrix = compatibility_of_artifacts(pair, old, language)
        checks += _compatibility_checks(old_matrix, candidate.version_id, incumbent.version_id,
                                        -criterion.retention_limit, "old domains")
    return {"passed": all(c["passed"] for c in checks), "checks": checks, "matrix": matrix,
            "criterion": {**asdict(criterion), "metric": METRIC, "old_domains": old_domains},
            "candidate": candidate.version_id, "incumbent": incumbent.version_id,
            "space": incumbent.space, "validation_items": len(validation)}


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


def _old_domains(validation: PairDataset, new_domain: str | None) -> list[str]:
    if new_domain is None:
        return []
    return [d for d in validation.domains() if d != new_domain]
