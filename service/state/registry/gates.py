"""A gate report counts only where it was measured.

The gate compares a candidate with one incumbent on one validation set under one
criterion, so its verdict says nothing about another gallery, another incumbent or
another validation set. Every stored report is therefore bound (``Binding``) to the
gallery it was run for, the version that served it (the incumbent), a content digest of
the validation set (``validation_digest``) and the criterion in force (``GatePolicy``).
A report is *current* while all four still hold; otherwise it is *stale*, with the
reasons (``stale_reasons``), computed whenever it is read: no background job marks it.
A promotion needs the newest current report for exactly that gallery to have passed
(``refusal``). The worker binds what it measures and the registry checks with the same
functions here, so both compute the digest and the criterion the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from service.state.config import Settings
from service.state.registry.index import utc_now
from service.state.registry.records import GalleryRecord
from training.data.dataset import manifest_rows
from training.errors import NobackfillError

MANIFEST = "manifest.jsonl"
UNREADABLE = "unreadable"  # the digest of a validation set that cannot be read now
CHUNK = 1 << 20

Digest = Callable[[str | None], str | None]


@dataclass(frozen=True)
class GatePolicy:
    """The criterion in force: the settings every gate runs under (a phase adds its own
    domain or language to it; see ``criterion``). A report measured under other settings
    does not count: a margin raised since must be met."""

    margin: float
    retention_limit: float
    max_negative_flip: float | None
    metric: str = "R@1"

    @classmethod
    def of(cls, settings: Any) -> GatePolicy:
        """From the process settings (the gateway's and the worker's alike)."""
        return cls(float(settings.gate_margin), float(settings.gate_retention_limit),
                   settings.gate_max_negative_flip)

    @classmethod
    def default(cls) -> GatePolicy:
        """The settings' defaults, read without the environment."""
        return cls.of(Settings.model_construct())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def criterion(self, new_domain: str | None = None, new_language: str | None = None) -> Any:
        """The ``training.gate.GateCriterion`` of a gate under this policy; retention is
        checked only for a phase that adds a domain or a language."""
        from training.gate import GateCriterion

        phase = bool(new_domain or new_language)
        return GateCriterion(margin=self.margin, new_domain=new_domain,
                             new_language=new_language,
                             retention_limit=self.retention_limit if phase else None,
                             max_negative_flip=self.max_negative_flip)


@dataclass(frozen=True)
class Binding:
    """Where a gate is measured: taken *before* the gate reads the validation set, so a
    set changed while the gate runs leaves the report stale rather than wrongly current."""

    gallery: str
    incumbent: str
    validation: str | None  # the path the gate reads
    digest: str | None  # validation_digest of it (None: no validation set)
    policy: GatePolicy

    @classmethod
    def now(cls, gallery: GalleryRecord, policy: GatePolicy,
            validation: str | None = None) -> Binding:
        """The gallery as it stands; ``validation`` defaults to the gallery's own set."""
        path = validation if validation is not None else gallery.validation
        return cls(gallery.name, gallery.active, path, validation_digest(path), policy)

    def apply(self, report: dict[str, Any]) -> dict[str, Any]:
        return {**report, "gallery": self.gallery, "incumbent": self.incumbent,
                "validation": {"path": self.validation, "digest": self.digest},
                "policy": self.policy.to_json(), "measured_at": utc_now()}


@dataclass(frozen=True)
class Standing:
    """A stored report and why it no longer counts for its gallery (empty: current)."""

    report: dict[str, Any]
    stale: tuple[str, ...]

    @property
    def current(self) -> bool:
        return not self.stale


def validation_digest(path: str | None) -> str | None:
    """sha256 over the validation manifest's bytes and, in its order, the bytes of every
    image it lists (a missing image hashes as missing): the same files give the same
    digest wherever they lie. None without a set; ``UNREADABLE`` when the manifest cannot
    be read (a report measured on readable data is then stale)."""
    if path is None:
        return None
    manifest = Path(path)
    digest = hashlib.sha256()
    try:
        if manifest.is_dir():
            manifest = manifest / MANIFEST
        digest.update(hashlib.sha256(manifest.read_bytes()).digest())
        for _, record in manifest_rows(manifest):
            digest.update(_file_digest(record.image_path))
    except (OSError, ValueError, NobackfillError):  # ValueError: undecodable text, bad name
        return UNREADABLE
    return f"sha256:{digest.hexdigest()}"


def _file_digest(path: Path | None) -> bytes:
    if path is None or not path.is_file():
        return hashlib.sha256(b"missing").digest()
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.digest()


def stale_reasons(report: dict[str, Any], gallery: GalleryRecord | None, digest: Digest,
                  policy: GatePolicy) -> tuple[str, ...]:
    """Why ``report`` does not count now for the gallery it names (``gallery``: that
    gallery's record, None when it is gone); ``digest`` gives a validation set's digest."""
    if not isinstance(report.get("gallery"), str):
        return ("it names no gallery (measured before reports were bound to one)",)
    if gallery is None:
        return (f"gallery '{report['gallery']}' no longer exists",)
    reasons = []
    if report.get("incumbent") != gallery.active:
        reasons.append(f"incumbent changed: it was measured against "
                       f"'{report.get('incumbent')}' but '{gallery.active}' serves now")
    validation = report.get("validation")
    measured = validation.get("digest") if isinstance(validation, dict) else None
    now = digest(gallery.validation)
    if measured != now or now == UNREADABLE:  # an unreadable set matches nothing
        reasons.append(f"validation set changed: measured on {_short(measured)}, the "
                       f"gallery's is {_short(now)} now")
    if report.get("policy") != policy.to_json():
        reasons.append(f"criterion changed: measured under {_changed(report, policy)}")
    return tuple(reasons)


def refusal(version: str, reports: Sequence[dict[str, Any]], gallery: GalleryRecord,
            digest: Digest, policy: GatePolicy) -> str | None:
    """None when the newest current report of ``version`` for ``gallery`` passed; else
    which report is missing, stale or failed."""
    mine = [r for r in reports if r.get("gallery") == gallery.name]
    where = f"version '{version}' for gallery '{gallery.name}'"
    if not mine:
        others = sorted({r["gallery"] for r in reports if isinstance(r.get("gallery"), str)})
        also = f" (it has reports for {others} only)" if others else ""
        return f"version '{version}' has no gate report for gallery '{gallery.name}'{also}"
    standing = [(r, stale_reasons(r, gallery, digest, policy)) for r in mine]
    current = [r for r, stale in standing if not stale]
    if not current:
        return f"the gate report of {where} is stale: {'; '.join(standing[-1][1])}"
    if current[-1].get("passed") is not True:
        return (f"the gate report of {where} (against '{gallery.active}') did not pass"
                + _reason(current[-1]))
    return None


def standings(reports: Sequence[dict[str, Any]], galleries: dict[str, GalleryRecord],
              digest: Digest, policy: GatePolicy) -> tuple[Standing, ...]:
    """Every report with its standing, oldest first."""
    return tuple(Standing(r, stale_reasons(r, galleries.get(str(r.get("gallery"))), digest,
                                           policy)) for r in reports)


def _short(digest: str | None) -> str:
    if digest is None:
        return "no validation set"
    return digest if digest == UNREADABLE else f"{digest[:19]}…"


def _changed(report: dict[str, Any], policy: GatePolicy) -> str:
    """The criterion fields that differ, then and now: "margin 0.0, now 0.05"."""
    then = report.get("policy")
    if not isinstance(then, dict):
        return "no recorded criterion"
    now = policy.to_json()
    return ", ".join(f"{k} {then.get(k)}, now {now[k]}" for k in now if then.get(k) != now[k])


def _reason(report: dict[str, Any]) -> str:
    reason = report.get("reason")
    return f" ({reason})" if isinstance(reason, str) else ""
