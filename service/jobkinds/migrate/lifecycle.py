"""A migration's life as one state machine: its phases, and which action moves it from
one to another (every allowed transition is listed here, once). Every transition, the
operator's (``actions``: switch, rollback, retire, cancel, pause, resume, keep) and the
applier's (``drive``: progressive, switch_back, finish, gate_failed, fail, and the
cancel it carries out: stop or undo), asks ``require`` before it changes anything; a
refused one is a Conflict (409) naming the phase and what is allowed.

A phase is read off three records: the registry's migration (which side serves:
``backfilling`` = the source, ``switched`` = the target, ``rolled_back`` = the source
again), its job (the backfill runs, or ended and how) and the migration's own record
(``record.MigrationState``: whether the job ended by its gate, whether the operator kept
both sides). No phase is stored, so none can disagree with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.state.errors import Conflict
from service.state.jobs.shards import PAUSED
from service.state.jobs.store import Job
from service.state.registry.records import Migration

if TYPE_CHECKING:
    from service.jobkinds.migrate.record import MigrationState

PHASES: dict[str, str] = {
    "backfilling": "the source side serves (through the route) while the backfill runs",
    "serving": "switched progressively: the target side serves while the backfill still runs",
    "stopped": "cancelled after a progressive switch: the backfill stopped where it was, "
               "the target side serves; resume it, roll back, or retire once no item holds "
               "a transformed vector",
    "awaiting": "the backfill ended without a switch (the gate failed, auto_switch is off, "
                "or items have no new vector): the source side serves; the operator switches "
                "(force, with a reason, past a failed gate) or cancels",
    "kept": "the backfill is over and both sides are kept as the served mode: searches "
            "are ranked by both (rerank: the route's top k scored by the new model's "
            "stored vectors; hybrid: both sides' scores summed), every write is embedded "
            "into both; switch to serve the native side alone, keep to change the mode, "
            "or cancel to drop the new side",
    "switched": "the target side serves and the backfill is over",
    "rolled_back": "the source side serves again after a switch; the target side is kept "
                   "(and still written) until retired",
    "undoing": "its job failed or was cancelled before any switch: the applier drops the "
               "target side and the gallery serves as before",
    "ended": "the migration is closed (undone, or retired)",
}

# phase -> action -> the phase it leads to. Actions: the operator's (switch, rollback,
# retire, cancel, pause, resume, keep) and the applier's (progressive, switch_back, finish,
# gate_failed, fail: its job failed, by a shard or a batch it could not write; the undo
# of an ``undoing`` migration is its ``fail`` or ``cancel``). ``finish`` from backfilling
# lands in switched or awaiting: the gate decides. ``pause`` holds a running backfill's shards at their cursors (a lazy
# migration: reranked searches fill the new side meanwhile) without leaving the phase;
# ``resume`` queues them again (or, after a stop, plans what is left). ``keep`` makes
# both sides the served mode at the end of the backfill (its mode can be changed).
# ``cancel`` from awaiting or kept undoes the migration at once (no backfill runs).
TRANSITIONS: dict[str, dict[str, str]] = {
    "backfilling": {"progressive": "serving", "finish": "switched|awaiting",
                    "cancel": "ended", "fail": "undoing", "pause": "backfilling",
                    "resume": "backfilling"},
    "undoing": {"fail": "ended", "cancel": "ended"},
    "serving": {"switch_back": "backfilling", "finish": "switched",
                "gate_failed": "awaiting", "cancel": "stopped", "rollback": "rolled_back",
                "pause": "serving", "resume": "serving", "fail": "stopped"},
    "stopped": {"resume": "serving", "rollback": "rolled_back", "retire": "ended"},
    "awaiting": {"switch": "switched", "cancel": "ended", "keep": "kept"},
    "kept": {"switch": "switched", "cancel": "ended", "keep": "kept"},
    "switched": {"rollback": "rolled_back", "retire": "ended"},
    "rolled_back": {"retire": "ended", "cancel": "rolled_back", "resume": "rolled_back",
                    "pause": "rolled_back", "finish": "rolled_back", "fail": "rolled_back"},
    "ended": {},
}
OPERATOR = ("switch", "rollback", "retire", "cancel", "pause", "resume", "keep")


def phase_of(m: Migration | None, job: Job | None,
             state: MigrationState | None = None) -> str:
    """The phase of migration ``m`` whose job record is ``job`` (None: its record is gone,
    the backfill cannot run) and whose own record is ``state``."""
    if m is None:
        return "ended"
    running = job is not None and not job.finished
    if m.state == "switched":
        if running:
            return "serving"
        return "stopped" if _stopped(job, state) else "switched"
    if m.state == "rolled_back":
        return "rolled_back"
    if running:
        return "backfilling"
    if state is not None and state.kept:
        return "kept"
    if job is None or job.status == "succeeded" or _gate_failed(state):
        return "awaiting"
    return "undoing"


def _gate_failed(state: MigrationState | None) -> bool:
    return state is not None and state.gate_failed


def _stopped(job: Job | None, state: MigrationState | None) -> bool:
    """Its backfill ended before its end after a switch (cancelled, or a shard failed):
    resumable from where each shard stopped. (A job failed by its gate ended its
    backfill: an operator's forced switch after it is a plain switch.)"""
    return job is not None and (job.status == "cancelled" or (
        job.status == "failed" and not _gate_failed(state)))


def paused(job: Job | None) -> bool:
    """Its backfill runs but is paused (``pause``; a lazy migration)."""
    return job is not None and not job.finished and bool(job.result.get(PAUSED))


def allowed(phase: str, action: str, job: Job | None = None,
            state: MigrationState | None = None) -> bool:
    """Whether ``action`` is a transition out of ``phase`` (with the conditions the table
    cannot show: pause needs a running backfill that is not paused; resume a paused one,
    or in rolled_back a stopped one; in rolled_back, cancel needs a running backfill)."""
    if action not in TRANSITIONS[phase]:
        return False
    if action == "pause":
        return job is not None and not job.finished and not paused(job)
    if action == "resume" and phase != "stopped":
        return paused(job) or (phase == "rolled_back" and _stopped(job, state))
    if phase == "rolled_back" and action == "cancel":
        return job is not None and not job.finished
    if phase == "rolled_back" and action == "retire":
        return job is None or job.finished
    return True


def options(phase: str, job: Job | None, state: MigrationState | None) -> list[str]:
    """The operator's actions allowed in ``phase``."""
    return [a for a in OPERATOR if allowed(phase, a, job, state)]


def require(gallery: str, m: Migration | None, job: Job | None, action: str,
            state: MigrationState | None = None) -> str:
    """The migration's phase, if ``action`` is allowed in it; else a Conflict that says the
    phase and what the operator can do instead."""
    phase = phase_of(m, job, state)
    if allowed(phase, action, job, state):
        return phase
    allowed_now = options(phase, job, state)
    if m is None:
        raise Conflict(f"gallery '{gallery}' has no migration to {action}")
    raise Conflict(f"cannot {action} the migration of gallery '{gallery}': it is {phase} "
                   f"({PHASES[phase]}); allowed now: {', '.join(allowed_now) or 'nothing'}")
