"""The registry: registration with checksums, gated promotion, force with a reason,
rollback, retiring versions, deleting galleries, atomic index writes, and locking across
concurrent writer processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import bound, register_gated

from service.state.errors import (
    AlreadyExists,
    Conflict,
    GalleryNotFound,
    GateFailed,
    InvalidArtifact,
    InvalidInput,
    SpaceMismatch,
    VersionNotFound,
)
from service.state.registry import Registry
from service.state.registry import index as index_module
from service.state.registry.gates import UNREADABLE, Binding, GatePolicy, validation_digest
from training.artifacts import WEIGHTS
from training.data import open_dataset, write_dataset
from training.gate import GateCriterion, run_gate

FORK = multiprocessing.get_context("fork")  # children only touch JSON files, never torch


@pytest.fixture
def registry(tmp_path: Path, micro_versions: dict[str, Path]) -> Registry:
    reg = Registry(tmp_path / "registry")
    for path in micro_versions.values():
        register_gated(reg, path, by="tester")
    return reg


def copy_as(source: Path, dest: Path, version_id: str, gate: dict | None = None,
            **fields: object) -> Path:
    """A copy of an artifact under another version id (the manifest is not checksummed)."""
    shutil.copytree(source, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["version_id"] = version_id
    manifest.pop("gate", None)
    if gate is not None:
        manifest["gate"] = gate
    (dest / "manifest.json").write_text(json.dumps({**manifest, **fields}))
    return dest


def test_register_copies_verifies_and_records(registry: Registry,
                                              micro_versions: dict[str, Path]) -> None:
    v2 = registry.version("v2")
    assert (v2.space, v2.routes, v2.registered_by) == ("v1", ("v1",), "tester")
    assert v2.gate == bound({"passed": True}) | {"measured_at": v2.gate["measured_at"]}
    assert registry.version("v1").gate is None
    assert registry.artifact("v2").version_id == "v2"  # checksums verified again on load
    assert micro_versions["v2"].exists()  # copied, not moved
    assert [v.version_id for v in registry.versions()] == ["v1", "v2", "v3"]
    assert registry.revision() == 3


def test_register_is_idempotent_and_refuses_a_different_artifact_under_a_taken_id(
        registry: Registry, micro_versions: dict[str, Path], tmp_path: Path) -> None:
    revision = registry.revision()
    assert registry.register(micro_versions["v1"], by="again") == registry.version("v1")
    assert registry.add(micro_versions["v1"], by="again") == (registry.version("v1"), False)
    assert registry.revision() == revision
    impostor = copy_as(micro_versions["v2"], tmp_path / "impostor", "v1")
    with pytest.raises(AlreadyExists, match="different files"):
        registry.register(impostor, by="tester")


def test_register_rejects_altered_artifacts_and_leaves_nothing(
        registry: Registry, micro_versions: dict[str, Path], tmp_path: Path) -> None:
    bad = copy_as(micro_versions["v1"], tmp_path / "bad", "v9")
    data = bytearray((bad / WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (bad / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(InvalidArtifact, match="sha256"):
        registry.register(bad, by="tester")
    with pytest.raises(InvalidArtifact, match="manifest.json is missing"):
        registry.register(tmp_path, by="tester")
    with pytest.raises(VersionNotFound):
        registry.version("v9")
    assert sorted(p.name for p in (registry.root / "versions").iterdir()) == ["v1", "v2", "v3"]


def test_register_gate_report_and_move(registry: Registry, micro_versions: dict[str, Path],
                                       tmp_path: Path) -> None:
    source = copy_as(micro_versions["v1"], tmp_path / "v4", "v4", gate={"passed": False})
    with pytest.raises(InvalidInput, match="boolean 'passed'"):
        registry.register(source, by="tester", gate={"recall": 0.9})
    record, created = registry.add(source, by="tester", move=True,
                                   gate={"passed": True, "t2i_r1": 0.91})
    assert created and record.gate == {"passed": True, "t2i_r1": 0.91}  # the service's
    assert registry.manifest("v4")["gate"] == record.gate  # the stored manifest agrees
    assert not source.exists() and registry.artifact("v4").version_id == "v4"


def test_a_gate_report_in_a_manifest_is_not_trusted(registry: Registry,
                                                    micro_versions: dict[str, Path],
                                                    tmp_path: Path) -> None:
    source = copy_as(micro_versions["v2"], tmp_path / "v7", "v7", gate={"passed": True})
    record = registry.register(source, by="outsider")
    assert record.gate is None and record.gate_status == "none"
    assert "gate" not in registry.manifest("v7")  # dropped from the stored copy
    assert json.loads((source / "manifest.json").read_text())["gate"] == {"passed": True}
    registry.create_gallery("shapes", "v1", by="ops", version="v1")
    with pytest.raises(GateFailed, match="no gate report"):
        registry.promote("shapes", "v7", by="ops")


def test_a_failed_move_gives_the_artifact_back(registry: Registry,
                                               micro_versions: dict[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    source = copy_as(micro_versions["v1"], tmp_path / "v6", "v6")

    def full_disk(tmp: Path, final: Path) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(index_module, "_publish", full_disk)
    with pytest.raises(OSError, match="No space"):
        registry.register(source, by="tester", move=True)
    assert source.is_dir() and (source / WEIGHTS).is_file()  # the caller still has it
    with pytest.raises(VersionNotFound):
        registry.version("v6")


def test_gallery_creation(registry: Registry) -> None:
    shapes = registry.create_gallery("shapes", "v1", by="ops")
    assert shapes.active == "v2"  # default: the newest version native to the space
    assert [(e.action, e.version, e.by) for e in shapes.history] == [("create", "v2", "ops")]
    with pytest.raises(AlreadyExists):
        registry.create_gallery("shapes", "v1", by="ops")
    with pytest.raises(InvalidInput, match="must match"):
        registry.create_gallery("Bad Name!", "v1", by="ops")
    with pytest.raises(SpaceMismatch, match="no route into space 'v1'"):
        registry.create_gallery("other", "v1", by="ops", version="v3")
    with pytest.raises(Conflict, match="natively into space 'nowhere'"):
        registry.create_gallery("other", "nowhere", by="ops")


def test_promotion_needs_a_passing_gate(registry: Registry, micro_versions: dict[str, Path],
                                        tmp_path: Path) -> None:
    registry.create_gallery("shapes", "v1", by="ops", version="v1")
    registry.register(copy_as(micro_versions["v2"], tmp_path / "v5", "v5"), by="tester",
                      gate=bound({"passed": False}))
    with pytest.raises(GateFailed, match="did not pass"):
        registry.promote("shapes", "v5", by="ops")
    registry.promote("shapes", "v2", by="ops", reason="better recall")
    with pytest.raises(GateFailed, match="no gate report"):
        registry.promote("shapes", "v1", by="ops")  # v1 has none; use rollback instead
    record = registry.gallery("shapes")
    assert record.active == "v2"
    event = record.history[-1]
    assert (event.action, event.version, event.previous, event.by, event.reason, event.forced) \
        == ("promote", "v2", "v1", "ops", "better recall", False)
    assert event.at.endswith("+00:00")


def test_force_needs_a_reason_and_is_recorded(registry: Registry) -> None:
    registry.create_gallery("shapes", "v1", by="ops", version="v1")
    with pytest.raises(SpaceMismatch, match="'v3'.*no route into space 'v1'"):
        registry.promote("shapes", "v3", by="ops")
    for reason in (None, "", "   "):
        with pytest.raises(InvalidInput, match="needs a reason"):
            registry.promote("shapes", "v3", by="ops", force=True, reason=reason)
    record = registry.promote("shapes", "v3", by="ops", force=True, reason="incident 42")
    event = record.history[-1]
    assert (event.forced, event.overrides, event.reason) == (True, ("space",), "incident 42")
    assert registry.gallery("shapes").active == "v3"
    v3 = registry.version("v3")  # the version records it too; its own gate did pass
    assert v3.forced == ({"gallery": "shapes", "by": "ops", "at": event.at,
                          "reason": "incident 42", "overrides": ["space"]},)
    assert v3.gate_status == "passed"


def test_a_promotion_forced_past_the_gate_shows_as_forced(registry: Registry,
                                                          micro_versions: dict[str, Path],
                                                          tmp_path: Path) -> None:
    registry.create_gallery("shapes", "v1", by="ops", version="v2")
    registry.register(copy_as(micro_versions["v1"], tmp_path / "v8", "v8"), by="tester")
    assert registry.version("v8").gate_status == "none"
    record = registry.promote("shapes", "v8", by="oncall", force=True, reason="hotfix")
    event = record.history[-1]
    assert (event.forced, event.overrides, event.by) == (True, ("gate",), "oncall")
    v8 = registry.version("v8")
    assert v8.gate_status == "forced" and v8.forced[0]["by"] == "oncall"
    assert v8.forced[0]["at"] == event.at and v8.forced[0]["overrides"] == ["gate"]
    # force on a version that passes everything skips nothing: not recorded as forced
    registry.add_gate("v2", bound({"passed": True}, incumbent="v8"))  # measured against v8
    calm = registry.promote("shapes", "v2", by="ops", force=True, reason="back")
    assert calm.history[-1].forced is False and registry.version("v2").forced == ()


def validation_set(path: Path, n: int = 4, seed: int = 5) -> str:
    write_dataset(path, n, seed=seed, languages=("en",), image_size=16)
    return str(path)


def test_a_gate_report_counts_only_for_the_gallery_it_was_measured_for(
        registry: Registry, micro_versions: dict[str, Path], tmp_path: Path) -> None:
    """Issue 30: 'bad' (random weights) fails the gate on 'demo'; a gallery 'wash' in the
    same space, served by 'bad' with a 4-image validation set, gates it against itself
    (it passes, cross == own). That report must not promote it into 'demo'."""
    policy = registry.gate_policy
    demo = registry.create_gallery("demo", "v1", by="ops", version="v1",
                                   validation=validation_set(tmp_path / "demo-set", 8, 1))
    registry.register(copy_as(micro_versions["v2"], tmp_path / "bad", "bad"), by="tester",
                      gate=Binding.now(demo, policy).apply({"passed": False}))
    with pytest.raises(GateFailed, match="for gallery 'demo' .*did not pass"):
        registry.promote("demo", "bad", by="ops")
    wash = registry.create_gallery("wash", "v1", by="ops", version="bad",
                                   validation=validation_set(tmp_path / "wash-set"))
    binding = Binding.now(wash, policy)
    itself = run_gate(registry.artifact("bad"), registry.artifact("bad"),
                      open_dataset(wash.validation), policy.criterion())
    assert itself["passed"] is True and itself["validation_items"] == 4
    registry.add_gate("bad", binding.apply(itself))
    with pytest.raises(GateFailed, match="for gallery 'demo' .*did not pass"):
        registry.promote("demo", "bad", by="ops")
    demo_now = registry.gallery("demo")
    assert demo_now.active == "v1" and [e.action for e in demo_now.history] == ["create"]
    # Without the failed 'demo' report, the 'wash' one still counts for 'wash' only.
    registry.register(copy_as(micro_versions["v2"], tmp_path / "bad2", "bad2"), by="tester",
                      gate=binding.apply(itself))
    with pytest.raises(GateFailed, match=r"no gate report for gallery 'demo' \(it has "
                                         r"reports for \['wash'\] only\)"):
        registry.promote("demo", "bad2", by="ops")
    assert registry.promote("demo", "bad2", by="ops", force=True,
                            reason="drill").history[-1].overrides == ("gate",)


def test_a_report_goes_stale_when_the_incumbent_validation_set_or_criterion_changes(
        registry: Registry, micro_versions: dict[str, Path], tmp_path: Path) -> None:
    policy = registry.gate_policy
    demo = registry.create_gallery("demo", "v1", by="ops", version="v1",
                                   validation=validation_set(tmp_path / "set"))
    registry.register(copy_as(micro_versions["v2"], tmp_path / "cand", "cand"), by="tester",
                      gate=Binding.now(demo, policy).apply({"passed": True}))

    def stale() -> tuple[str, ...]:
        return registry.gate_standings([registry.version("cand")])["cand"][-1].stale
    assert stale() == ()
    stricter = Registry(registry.root, gate_policy=replace(policy, margin=0.05))
    with pytest.raises(GateFailed, match="stale: criterion changed: measured under margin "
                                         "0.0, now 0.05"):
        stricter.promote("demo", "cand", by="ops")
    image = tmp_path / "set" / "images" / json.loads(
        (tmp_path / "set" / "manifest.jsonl").read_text().splitlines()[0])["image"].split("/")[-1]
    original = image.read_bytes()
    image.write_bytes(original + b"\0")  # the same manifest, one image changed
    assert stale() and stale()[0].startswith("validation set changed: measured on sha256:")
    with pytest.raises(GateFailed, match="stale: validation set changed"):
        registry.promote("demo", "cand", by="ops")
    image.write_bytes(original)  # the digest is of the content: the same bytes count again
    assert stale() == ()
    registry.add_gate("v2", Binding.now(demo, policy).apply({"passed": True}))
    registry.promote("demo", "v2", by="ops")
    assert stale() == ("incumbent changed: it was measured against 'v1' but 'v2' serves now",)
    with pytest.raises(GateFailed, match="stale: incumbent changed"):
        registry.promote("demo", "cand", by="ops")
    forced = registry.promote("demo", "cand", by="ops", force=True, reason="on call")
    assert (forced.active, forced.history[-1].overrides) == ("cand", ("gate",))
    reports = registry.version("cand").gates
    assert [r["incumbent"] for r in reports] == ["v1"]  # kept, with what it compared
    assert reports[0]["validation"]["digest"] == validation_digest(demo.validation)
    assert reports[0]["policy"] == policy.to_json() and reports[0]["gallery"] == "demo"


def test_every_report_is_kept_and_a_legacy_unbound_gate_authorises_nothing(
        registry: Registry, micro_versions: dict[str, Path], tmp_path: Path) -> None:
    shapes = registry.create_gallery("shapes", "v1", by="ops", version="v1")
    first = registry.version("v2").gate
    second = Binding.now(shapes, registry.gate_policy).apply({"passed": False})
    registry.add_gate("v2", second)
    v2 = registry.version("v2")
    assert v2.gates == (first, second) and v2.gate == second and v2.gate_status == "failed"
    assert registry.manifest("v2")["gates"] == [first, second]
    assert registry.manifest("v2")["gate"] == second
    index = json.loads((registry.root / "index.json").read_text())
    entry = index["versions"]["v2"]
    del entry["gates"]
    entry["gate"] = {"passed": True}  # as the registry stored one report before
    (registry.root / "index.json").write_text(json.dumps(index))
    legacy = registry.version("v2")
    assert legacy.gates == ({"passed": True},) and legacy.gate_status == "passed"
    with pytest.raises(GateFailed, match="no gate report for gallery 'shapes'"):
        registry.promote("shapes", "v2", by="ops")
    assert registry.gate_standings([legacy])["v2"][0].stale == (
        "it names no gallery (measured before reports were bound to one)",)


def test_the_validation_digest_is_of_the_content(tmp_path: Path) -> None:
    path = validation_set(tmp_path / "a")
    digest = validation_digest(path)
    assert digest is not None and digest.startswith("sha256:")
    assert validation_digest(str(Path(path) / "manifest.jsonl")) == digest
    shutil.copytree(path, tmp_path / "b")
    assert validation_digest(str(tmp_path / "b")) == digest  # the same files elsewhere
    min((tmp_path / "b" / "images").iterdir()).unlink()  # one image gone
    assert validation_digest(str(tmp_path / "b")) not in (digest, UNREADABLE)
    assert validation_digest(str(tmp_path / "nowhere")) == UNREADABLE
    assert validation_digest(None) is None


def test_the_criterion_in_force_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """The worker runs the gate under ``policy.criterion`` and binds ``policy``; the
    registry checks against the same policy, built from the same settings."""
    from service.state.config import Settings

    for name in ("MARGIN", "RETENTION_LIMIT", "MAX_NEGATIVE_FLIP"):
        monkeypatch.delenv(f"NOBACKFILL_GATE_{name}", raising=False)
    assert GatePolicy.default() == GatePolicy.of(Settings())
    policy = GatePolicy.of(Settings(gate_margin=0.01, gate_retention_limit=0.03,
                                    gate_max_negative_flip=0.1))
    assert policy.to_json() == {"margin": 0.01, "retention_limit": 0.03,
                                "max_negative_flip": 0.1, "metric": "R@1"}
    assert policy.criterion() == GateCriterion(margin=0.01, max_negative_flip=0.1)
    assert policy.criterion(new_domain="polygons") == GateCriterion(
        margin=0.01, retention_limit=0.03, new_domain="polygons", max_negative_flip=0.1)
    assert Registry.of(Settings(data_dir=tmp_path, gate_margin=0.01)).gate_policy.margin == 0.01


def test_retiring_a_version(registry: Registry, micro_versions: dict[str, Path],
                            tmp_path: Path) -> None:
    registry.create_gallery("shapes", "v1", by="ops", version="v1")
    registry.register(copy_as(micro_versions["v2"], tmp_path / "v5", "v5", parent="v2"),
                      by="tester", gate=bound({"passed": True}, incumbent="v2"))
    registry.promote("shapes", "v2", by="ops")
    registry.promote("shapes", "v5", by="ops")
    with pytest.raises(Conflict, match="'v5' serves gallery 'shapes'"):
        registry.delete_version("v5")
    with pytest.raises(Conflict, match="parent of 'v5', which serves gallery 'shapes'"):
        registry.delete_version("v2")
    with pytest.raises(VersionNotFound):
        registry.delete_version("nope")
    revision = registry.revision()
    assert registry.delete_version("v1").version_id == "v1"  # only in the history: retired
    assert registry.revision() == revision + 1
    assert [v.version_id for v in registry.versions()] == ["v2", "v3", "v5"]
    assert sorted(p.name for p in (registry.root / "versions").iterdir()) == ["v2", "v3", "v5"]
    with pytest.raises(VersionNotFound):
        registry.rollback("shapes", "v1", by="ops")
    assert register_gated(registry, micro_versions["v1"]).version_id == "v1"  # back again


def test_deleting_a_gallery_leaves_a_tombstone_until_it_is_finished(
        registry: Registry) -> None:
    registry.create_gallery("shapes", "v1", by="ops", version="v1")
    record = registry.retire_gallery("shapes", by="ops")
    assert record.active == "v1" and registry.galleries() == []
    with pytest.raises(GalleryNotFound):
        registry.gallery("shapes")
    with pytest.raises(Conflict, match="still being deleted"):
        registry.create_gallery("shapes", "v1", by="ops", version="v1")
    with pytest.raises(Conflict, match="still being deleted"):
        registry.check_new_gallery("shapes")
    assert registry.retire_gallery("shapes", by="ops") == record  # an interrupted one resumes
    registry.forget_gallery("shapes")
    registry.check_new_gallery("shapes")
    assert registry.create_gallery("shapes", "v1", by="ops", version="v1").active == "v1"
    with pytest.raises(GalleryNotFound):
        registry.retire_gallery("nope", by="ops")


def test_rollback_reactivates_any_earlier_version(registry: Registry) -> None:
    registry.create_gallery("shapes", "v1", by="ops", version="v1")
    registry.promote("shapes", "v2", by="ops")
    with pytest.raises(Conflict, match="never active"):
        registry.rollback("shapes", "v3", by="ops")
    with pytest.raises(VersionNotFound):
        registry.rollback("shapes", "nope", by="ops")
    with pytest.raises(GalleryNotFound):
        registry.rollback("nope", "v1", by="ops")
    record = registry.rollback("shapes", "v1", by="oncall", reason="latency regression")
    assert record.active == "v1"
    assert [(e.action, e.version, e.previous) for e in record.history] == [
        ("create", "v1", None), ("promote", "v2", "v1"), ("rollback", "v1", "v2")]
    assert record.history[-1].by == "oncall"
    assert registry.rollback("shapes", "v2", by="ops").active == "v2"  # forward again
    revision = registry.revision()
    assert registry.promote("shapes", "v2", by="ops").active == "v2"  # no-op, not recorded
    assert registry.revision() == revision


def test_a_failed_change_writes_nothing(registry: Registry) -> None:
    before = registry.index.path.read_bytes()

    def boom(index: dict) -> None:
        index["galleries"]["half"] = {"broken": True}
        raise RuntimeError("crash inside the change")
    with pytest.raises(RuntimeError):
        registry.index.update(boom)
    assert registry.index.path.read_bytes() == before


def _hang_before_publish(root: Path) -> None:
    """Child: write a new index, then hang right before the rename that commits it."""
    def hang(tmp: Path, final: Path) -> None:
        time.sleep(60)
    index_module._publish = hang
    Registry(root).create_gallery("doomed", "v1", by="child", version="v1")


def test_a_writer_killed_mid_update_leaves_the_previous_index(registry: Registry) -> None:
    before = registry.index.read()
    child = FORK.Process(target=_hang_before_publish, args=(registry.root,))
    child.start()
    deadline = time.monotonic() + 30
    while not list(registry.root.glob(".index.json.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(registry.root.glob(".index.json.tmp-*")), "the child never wrote its temp file"
    os.kill(child.pid, signal.SIGKILL)  # crash with the lock held and the new index unpublished
    child.join()
    assert registry.index.read() == before
    assert [g.name for g in registry.galleries()] == []
    # The OS released the dead writer's lock: the next update goes through at once.
    registry.index.lock_timeout_s = 5
    registry.create_gallery("after", "v1", by="ops", version="v1")
    assert registry.revision() == before["revision"] + 1


def _create_many(root: Path, worker: int, count: int) -> None:
    reg = Registry(root)
    for n in range(count):
        reg.create_gallery(f"w{worker}-{n}", "v1", by=f"worker{worker}", version="v1")


def test_concurrent_writer_processes_lose_no_update(registry: Registry) -> None:
    start = registry.revision()
    workers, each = 4, 8
    procs = [FORK.Process(target=_create_many, args=(registry.root, w, each))
             for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * workers
    names = {g.name for g in registry.galleries()}
    assert names == {f"w{w}-{n}" for w in range(workers) for n in range(each)}
    assert registry.revision() == start + workers * each
    assert not list(registry.root.glob(".index.json.tmp-*"))


def test_migration_states_are_one_atomic_update_each(registry: Registry,
                                                     micro_versions: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """begin -> switch -> rollback -> retire, and abort: each a Conflict out of order;
    while two sides are kept, only a version embedding into both may serve."""
    up = copy_as(micro_versions["v3"], tmp_path / "up", "up", gate={"passed": True},
                 routes={"v3": {"kind": "native"}, "v1": {"kind": "adapter"}})
    register_gated(registry, up, gallery="g")
    registry.create_gallery("g", "v1", by="t", version="v1")
    with pytest.raises(Conflict, match="already in space 'v1'"):
        registry.begin_migration("g", job="j0", source="c-old", target="c-new", by="t")
    registry.promote("g", "up", by="t")
    record = registry.begin_migration("g", job="j1", source="c-old", target="c-new", by="t")
    assert record.collection == "c-old" and record.migration.state == "backfilling"
    assert [(s.space, s.collection) for s in record.sides()] == [("v1", "c-old"),
                                                                ("v3", "c-new")]
    with pytest.raises(Conflict, match="already has a migration"):
        registry.begin_migration("g", job="j2", source="c-old", target="c-x", by="t")
    with pytest.raises(Conflict, match="no route into \\['v3'\\]"):
        registry.promote("g", "v2", by="t")  # v2 embeds into v1 only
    with pytest.raises(Conflict, match="not switched"):
        registry.rollback_migration("g", by="t")
    with pytest.raises(Conflict, match="cancel its job j1"):
        registry.end_migration("g", abort=False)

    switched = registry.switch_migration("g", by="t")
    assert (switched.space, switched.collection) == ("v3", "c-new")
    assert [s.space for s in switched.sides()] == ["v3", "v1"]
    assert switched.history[-1].action == "migrate" and switched.history[-1].space == "v3"
    back = registry.rollback_migration("g", by="t", reason="check")
    assert (back.space, back.collection, back.migration.state) == ("v1", "c-old", "rolled_back")
    with pytest.raises(Conflict, match="retire it instead"):
        registry.end_migration("g", abort=True)
    ended, dropped = registry.end_migration("g", abort=False)
    assert ended.migration is None and (dropped.space, dropped.collection) == ("v3", "c-new")
    assert Registry(registry.root).gallery("g") == ended  # persisted, read back whole

    registry.begin_migration("g", job="j3", source="c-old", target="c-new2", by="t")
    aborted, dropped = registry.end_migration("g", abort=True)
    assert aborted.migration is None and dropped.collection == "c-new2"
    assert (aborted.space, aborted.collection) == ("v1", "c-old")
