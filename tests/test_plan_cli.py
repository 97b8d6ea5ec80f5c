"""``nobackfill plan`` (``service.stack.plan_cli``) against a real gateway: the app of
``gateway_factory`` served by a real uvicorn on a free port, the CLI talking to it over
HTTP with urllib. No worker runs here: a finished plan is a ``plan`` job record written
into the gateway's job store, its result a plan built by ``make_plan`` from hand-made
options with real hit arrays (what the worker computes from models, without the models),
its basis the gallery's as ``basis_now`` reads it (stale: another active version)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ADMIN, ADMIN_KEY
from test_service_probe import served

from service.stack import plan_cli
from training.cli import build_parser

DIRS = ("t2i", "i2t")
RECOMMENDED = "route:affine+slerp"


def cli(*argv: str) -> Any:
    return build_parser().parse_args(["plan", *argv])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = plan_cli.run(cli(*argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- a plan, as the worker writes it
@pytest.fixture(scope="module")
def plan_record() -> dict[str, Any]:
    """Two measured routes (a cheap weak one, a dearer strong one), an XBT only costed, and
    two migrations (today's, and a progressive one that switches at 20%), under a budget
    of half a backfill and 1 ms of added latency: the strong route is recommended."""
    from training.upgrades.plan.build import Costs, make_plan
    from training.upgrades.plan.decide import Constraints
    from training.upgrades.plan.measure import GRID, Option, Scorer

    rng = np.random.default_rng(0)
    q = 400
    old = {d: rng.random(q) < 0.4 for d in DIRS}
    new = {d: rng.random(q) < 0.8 for d in DIRS}
    pick = {d: rng.random(q) for d in DIRS}

    def mix(p: float) -> dict[str, np.ndarray]:
        """NEW's hit on a share ``p`` of the queries, OLD's elsewhere."""
        return {d: np.where(pick[d] < p, new[d], old[d]) for d in DIRS}

    def route(method: str, slerp_t: float) -> dict[str, Any]:
        return {"kind": "adapter", "config": {"method": method, "slerp_t": slerp_t, "seed": 0}}

    options = [
        Option("route:procrustes", "route", "procrustes adapter", 0.4, 0.02, hits=mix(0.3),
               added_latency_ms={"text": 0.1, "image": 0.0},
               storage={"gallery_bytes": 0, "model_bytes": 8448},
               apply=route("procrustes", 0.0)),
        Option(RECOMMENDED, "route", "affine adapter + SLERP with the old query", 1.0, 0.05,
               hits=mix(0.75), added_latency_ms={"text": 0.6, "image": 0.5},
               storage={"gallery_bytes": 0, "model_bytes": 13_000_000},
               apply=route("affine", 0.5)),
        Option("xbt", "route", "XBT (text-only projector, then LoRA and soft prompts)", 60.0,
               3.0, measured=False, note="no trained XBT version is registered: estimated "
                                         "cost"),
        Option("migrate", "migration", "re-embed every item", 20.0, 1.0, hits=new,
               added_latency_ms={"text": 0.6, "image": 0.5},
               storage={"gallery_bytes": 256_000, "model_bytes": 0},
               apply={"kind": "migrate", "route": RECOMMENDED, "params": {"transform": False}},
               served={f: new if f >= 1.0 else mix(0.75) for f in GRID}, switch_at=1.0),
        Option("migrate:transform+learned", "migration", "transform, learned order", 21.0,
               1.05, hits=new, added_latency_ms={"text": 0.6, "image": 0.5},
               storage={"gallery_bytes": 256_000, "model_bytes": 0},
               apply={"kind": "migrate", "route": RECOMMENDED,
                      "params": {"transform": True, "order": "learned",
                                 "switch": "progressive", "sample": 100, "seed": 0}},
               served={f: mix(0.75) if f < 0.2 else mix(0.75 + 0.25 * f) for f in GRID},
               switch_at=0.2, overhead_fraction=0.05, before=mix(0.75)),
    ]
    plan = make_plan(options, Scorer(old, new, seed=0), Costs(1000, 100, 2.0),
                     Constraints(budget=0.5, max_added_latency_ms=1.0), old, new)
    plan.update({"sample": {"items": 10, "pairs": {"text": 10}, "seconds": 0.2},
                 "seconds": {"sample": 0.2, "total": 3.25}})
    return json.loads(json.dumps(plan))  # as it comes back from the job store


def params(validation: str | None = None) -> dict[str, Any]:
    from service.api.schemas.plans import PlanIn

    return PlanIn.model_validate({"new": {"version": "v3"}, "validation": validation,
                                  "constraints": {"budget": 0.5, "max_added_latency_ms": 1.0}}
                                 ).model_dump(by_alias=True)


def seed_plan(client: Any, plan: dict[str, Any] | None, status: str = "succeeded",
              incumbent: str | None = None) -> str:
    """A plan job of 'shapes' in the gateway's store: ``status``, with ``plan`` and the
    gallery's basis (its active version replaced by ``incumbent``: stale)."""
    from service.jobkinds.plan import basis_now

    gateway = client.app.state.gateway
    job = gateway.jobs.create("plan", "shapes", params(), by="ops")
    if status == "succeeded":
        basis = basis_now(gateway.registry, gateway.store, "shapes", None)
        if incumbent is not None:
            basis = {**basis, "incumbent": incumbent}
        gateway.jobs.update(job.id, lambda j: j.merged(status="succeeded", result={
            "plan": plan, "basis": basis}))
    return job.id


def table_lines(out: str, names: set[str]) -> dict[str, str]:
    """The options table's lines by option name."""
    lines: dict[str, str] = {}
    for line in out.splitlines():
        words = line.lstrip("* ").split()
        if words and words[0] in names:
            lines.setdefault(words[0], line)
    return lines


# ---------------------------------------------------------------- parsing and bodies
def test_the_command_is_plugged_into_nobackfill() -> None:
    args = cli("show", "--gallery", "g", "job-1", "--gateway", "http://x:1", "--key", "k")
    assert args.func is plan_cli.run
    assert (args.action, args.gallery, args.plan_id, args.gateway, args.key, args.json) == (
        "show", "g", "job-1", "http://x:1", "k", False)
    args = cli("apply", "--gallery", "g", "job-1", "route:affine", "--force", "--reason", "why")
    assert (args.option, args.force, args.reason) == ("route:affine", True, "why")
    with pytest.raises(SystemExit):
        cli("start", "--gallery", "g")  # --version is required
    with pytest.raises(SystemExit):
        cli("start", "--gallery", "g", "--version", "v2", "--objective", "best")


def test_start_sends_only_what_was_given_and_the_api_takes_it() -> None:
    from service.api.schemas.plans import PlanIn

    assert plan_cli.start_body(cli("start", "--gallery", "g", "--version", "v2")) == {
        "new": {"version": "v2"}}
    body = plan_cli.start_body(cli(
        "start", "--gallery", "g", "--version", "v2", "--sample", "64", "--seed", "3", "--validation",
        "/data/val", "--objective", "mean", "--max-added-latency-ms", "5",
        "--max-negative-flip", "0.01", "--budget", "0.1", "--budget-gpu-hours", "2", "--wait"))
    assert body == {"new": {"version": "v2"}, "sample": 64, "seed": 3,
                    "validation": "/data/val", "objective": "mean",
                    "constraints": {"max_added_latency_ms": 5.0, "max_negative_flip": 0.01,
                                    "budget": 0.1, "budget_gpu_hours": 2.0}}
    parsed = PlanIn.model_validate(body)
    assert parsed.new.version == "v2" and parsed.constraints.budget == 0.1


# ---------------------------------------------------------------- through a real gateway
def test_start_is_refused_with_the_apis_message(gateway_factory,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from service.state.jobs.workers import write_beat

    with gateway_factory() as client, served(client.app) as url:
        where = ("--gateway", url, "--key", ADMIN_KEY)
        write_beat(client.app.state.gateway.settings, "gpu0@host", "now")
        # 'shapes' has no validation set: nothing to measure on.
        code, out, err = run(capsys, "start", "--gallery", "shapes", "--version", "v3", *where)
        assert (code, out) == (1, "")
        assert err.startswith("error: 422 ") and "has no validation set" in err, err
        code, out, err = run(capsys, "list", "--gallery", "shapes", *where)
        assert (code, out.strip()) == (0, "gallery shapes has no plans")
        # An unknown candidate, a constraint out of range: the API's 422 too.
        code, _, err = run(capsys, "start", "--gallery", "shapes", "--version", "nope", *where)
        assert code == 1 and err.startswith("error: 422 ") and "nope" in err, err
        code, _, err = run(capsys, "start", "--gallery", "shapes", "--version", "v3",
                           "--max-negative-flip", "2", *where)
        assert code == 1 and err.startswith("error: 422 ") and "max_negative_flip" in err, err
        # Without the admin key.
        code, _, err = run(capsys, "start", "--gallery", "shapes", "--version", "v3", "--gateway", url)
        assert code == 1 and err.startswith("error: 401 "), err


def test_show_list_and_apply_of_plans(gateway_factory, plan_record: dict[str, Any],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with gateway_factory() as client, served(client.app) as url:
        where = ("--gateway", url, "--key", ADMIN_KEY)
        done = seed_plan(client, plan_record)
        stale = seed_plan(client, plan_record, incumbent="v2")
        queued = seed_plan(client, None, status="queued")

        # show: the finished plan's table, recommendation, curve, backfill; not stale.
        code, out, err = run(capsys, "show", "--gallery", "shapes", done, *where)
        assert (code, err) == (0, "")
        assert out.strip() == plan_cli.render(json.loads(json.dumps(
            client.get(f"/v1/galleries/shapes/plans/{done}", headers=ADMIN).json())))
        assert "status       succeeded" in out
        assert f"recommendation: {RECOMMENDED}" in out
        assert "stale: no (the plan still describes the gallery)" in out
        lines = table_lines(out, {RECOMMENDED})
        assert lines[RECOMMENDED].startswith("*  ")
        code, out, _ = run(capsys, "show", "--gallery", "shapes", done, "--json", *where)
        view = json.loads(out)
        assert (view["id"], view["status"], view["stale"]) == (done, "succeeded", [])
        assert view["plan"]["recommendation"]["option"] == RECOMMENDED

        # show of a plan not finished: its status, no table.
        code, out, _ = run(capsys, "show", "--gallery", "shapes", queued, *where)
        assert code == 0 and "status       queued" in out and "option" not in out

        # list: newest first, with the recommendation and whether each is current.
        code, out, _ = run(capsys, "list", "--gallery", "shapes", *where)
        assert code == 0
        rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
        assert out.splitlines()[0].split() == ["plan", "status", "created", "candidate",
                                               "recommended", "basis"]
        assert rows[done][1:2] + rows[done][3:] == ["succeeded", "v3", RECOMMENDED, "current"]
        assert rows[stale][1:2] + rows[stale][3:] == ["succeeded", "v3", RECOMMENDED, "stale"]
        assert rows[queued][1:2] + rows[queued][3:] == ["queued", "v3", "–", "–"]
        code, out, _ = run(capsys, "list", "--gallery", "shapes", "--json", *where)
        assert sorted(v["id"] for v in json.loads(out)) == sorted([done, stale, queued])

        # apply: an unknown option is the API's 422, naming the plan's options.
        code, out, err = run(capsys, "apply", "--gallery", "shapes", done, "route:nope", *where)
        assert (code, out) == (1, "")
        assert err.startswith("error: 422 ") and "has no option 'route:nope'" in err, err
        assert RECOMMENDED in err and "migrate:transform+learned" in err
        # a stale plan: 409, with why; forced without a reason: 422.
        code, out, err = run(capsys, "apply", "--gallery", "shapes", stale, RECOMMENDED, *where)
        assert (code, out) == (1, "")
        assert err.startswith("error: 409 ") and "is stale" in err, err
        assert "active version is now 'v1'" in err and "'v2'" in err
        code, _, err = run(capsys, "apply", "--gallery", "shapes", stale, RECOMMENDED, "--force", *where)
        assert code == 1 and err.startswith("error: 422 ") and "reason" in err, err
        code, out, _ = run(capsys, "show", "--gallery", "shapes", stale, *where)
        assert "stale: the gallery's active version is now 'v1'" in out
        assert "(apply needs --force --reason)" in out
        # a plan not finished: 409; an option that cannot be applied: 409; none such: 404.
        code, _, err = run(capsys, "apply", "--gallery", "shapes", queued, RECOMMENDED, *where)
        assert code == 1 and err.startswith("error: 409 ") and "is queued" in err, err
        code, _, err = run(capsys, "apply", "--gallery", "shapes", done, "xbt", *where)
        assert code == 1 and err.startswith("error: 409 ") and "cannot be applied" in err, err
        code, _, err = run(capsys, "show", "--gallery", "shapes", "job-000000000000", *where)
        assert code == 1 and err.startswith("error: 404 ") and "has no plan" in err, err
        code, _, err = run(capsys, "apply", "--gallery", "other", done, RECOMMENDED, *where)
        assert code == 1 and err.startswith("error: 404 "), err


def test_start_waits_for_the_plan_then_shows_it_and_an_option_is_applied(
        gateway_factory, plan_record: dict[str, Any], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--wait polls until the plan ends (a stand-in worker takes the queued job, reports a
    stage and finishes it with the plan), then shows it; apply starts the route's adapter
    job and the plan records it."""
    from service.jobkinds.plan import basis_now
    from service.state.jobs.workers import write_beat
    from training.data import write_dataset

    write_dataset(tmp_path / "val", 4, seed=3, languages=("en",), image_size=16)
    validation = str(tmp_path / "val")
    with gateway_factory() as client, served(client.app) as url:
        where = ("--gateway", url, "--key", ADMIN_KEY)
        gateway = client.app.state.gateway
        write_beat(gateway.settings, "gpu0@host", "now")
        r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": [
            {"id": f"p{i}", "text": f"a {c} square"} for i, c in
            enumerate(("red", "green", "blue", "black", "white", "grey", "pink", "brown",
                       "orange", "purple"))]})
        assert r.status_code == 200, r.text
        failures: list[BaseException] = []

        def worker() -> None:
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    jobs = [j for j in gateway.jobs.list() if j.kind == "plan"]
                    if jobs:
                        break
                    time.sleep(0.02)
                job = jobs[0]
                time.sleep(0.2)
                gateway.jobs.start(job.id, "gpu0@host")
                gateway.jobs.beat(job.id, {"stage": "fit the adapters"})
                time.sleep(0.3)
                basis = basis_now(gateway.registry, gateway.store, "shapes", validation)
                gateway.jobs.finish(job.id, "succeeded", result={"plan": plan_record,
                                                                 "basis": basis})
            except BaseException as exc:  # noqa: BLE001  (re-raised by the test)
                failures.append(exc)

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        code, out, err = run(capsys, "start", "--gallery", "shapes", "--version", "v3", "--validation",
                             validation, "--budget", "0.5", "--max-added-latency-ms", "1",
                             "--wait", "--poll", "0.05", *where)
        thread.join(60)
        assert not failures, failures
        assert code == 0, err
        plan_id = next(j.id for j in gateway.jobs.list() if j.kind == "plan")
        assert err.startswith(f"{plan_id}: queued\n") and f"{plan_id}: succeeded\n" in err, err
        assert f"plan         {plan_id}" in out and f"recommendation: {RECOMMENDED}" in out
        constraints = next(line for line in out.splitlines() if line.startswith("constraints"))
        assert "max_added_latency_ms 1" in constraints and "budget 0.5" in constraints
        assert f"validation {validation}" in out and "stale: no" in out
        job = gateway.jobs.get(plan_id)
        assert job.params["validation"] == validation
        assert job.params["constraints"]["budget"] == 0.5

        code, out, err = run(capsys, "apply", "--gallery", "shapes", plan_id, RECOMMENDED, *where)
        assert code == 0, err
        assert out.startswith(f"applied option {RECOMMENDED} of plan {plan_id}: started "
                              f"adapter job job-"), out
        code, out, _ = run(capsys, "show", "--gallery", "shapes", plan_id, *where)
        assert f"applied: {RECOMMENDED} -> adapter job-" in out and "by ops" in out


# ---------------------------------------------------------------- rendering
def test_the_table_of_a_finished_plan(plan_record: dict[str, Any]) -> None:
    view: dict[str, Any] = {"id": "job-1", "gallery": "shapes", "status": "succeeded", "progress": {},
            "error": None, "params": params(), "plan": plan_record,
            "basis": {"items": 1000, "incumbent": "v1", "space": "v1",
                      "validation": {"path": "/data/val", "digest": "x"}},
            "stale": [], "applied": []}
    out = plan_cli.render(view)
    header, *_ = [line for line in out.splitlines() if line.lstrip().startswith("option")]
    assert header.split() == ["option", "share", "t2i", "share", "i2t", "neg", "flip", "+ms",
                              "compute", "why", "not"]
    rows = {r["name"]: r for r in plan_record["options"]}
    lines = table_lines(out, set(rows))
    assert set(lines) == set(rows)
    for name, row in rows.items():
        line = lines[name]
        assert line.startswith("*  ") == (name == RECOMMENDED) == row["recommended"]
        if row["measured"]:
            for d in DIRS:
                assert plan_cli.share(row["share"][d]) in line, (name, line)
            assert " ± " in line
            assert plan_cli.pct(max(row["negative_flip"].values())) in line
            assert f"{max(row['added_latency_ms'].values()):+.2f}" in line
        assert f"{row['compute']['fraction']:.3g}" in line
        if row["why_not"]:
            assert row["why_not"] in line, (name, line)
    assert "route:affine+slerp gains more" in lines["route:procrustes"]
    assert "> budget 0.5" in lines["migrate"] and "> budget 0.5" in lines[
        "migrate:transform+learned"]
    assert "not measured (estimated cost only): no trained XBT version" in lines["xbt"]
    rec = plan_record["recommendation"]
    assert f"recommendation: {RECOMMENDED}\n  why: {rec['why']}" in out
    # the curve, briefly: the best migration's points at 0, 25, 50, 75, 100% and its switch
    curve = plan_record["curve"]
    assert curve["option"] == "migrate:transform+learned" and curve["switch_at"] == 0.2
    assert ("curve of migrate:transform+learned (switches at 20.0% of the backfill):"
            in out)
    shown = [r[0] for r in plan_cli.curve_rows(curve)]
    assert shown == ["0.0%", "20.0% (switch)", "25.0%", "50.0%", "75.0%", "100.0%"]
    last = next(p for p in curve["points"] if p["fraction"] == 1.0)
    assert plan_cli.curve_rows(curve)[-1] == [
        "100.0%", f"{last['compute']:.3g}", plan_cli.share(last["t2i"]),
        plan_cli.share(last["i2t"])]
    assert "full backfill: 1000 items at 50.0 items/s: 20.0 s (0.0056 h); planned in 3.2 s" \
        in out
    assert "measured on  1000 items, active version v1, validation /data/val" in out
    assert "stale: no" in out
    # stale, applied, failed
    out = plan_cli.render({**view, "stale": ["the gallery's active version is now 'v2'"],
                           "applied": [{"option": RECOMMENDED, "job": "job-2",
                                        "kind": "adapter", "by": "ops", "at": "t",
                                        "forced": True, "reason": "tested"}]})
    assert ("stale: the gallery's active version is now 'v2' (apply needs --force --reason)"
            in out)
    assert f"applied: {RECOMMENDED} -> adapter job-2 by ops at t (forced: tested)" in out
    out = plan_cli.render({**view, "status": "failed", "plan": None, "basis": None,
                           "error": "ConfigError: boom"})
    assert "error        ConfigError: boom" in out and "recommendation" not in out
    out = plan_cli.render({**view, "status": "running", "plan": None,
                           "progress": {"stage": "fit the transform"}})
    assert "stage        fit the transform" in out


def test_wait_fails_when_the_plan_fails(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    answers = iter([{"id": "job-1", "status": "queued"},
                    {"id": "job-1", "status": "running", "progress": {"stage": "embed"}},
                    {"id": "job-1", "status": "running", "progress": {"stage": "embed"}},
                    {"id": "job-1", "status": "failed", "error": "out of memory",
                     "params": {}, "progress": {}}])
    calls = []

    def fake(gateway: str, method: str, path: str, key: str | None = None,
             body: Any = None, timeout: float = 60) -> Any:
        calls.append((method, path, body))
        return next(answers)

    monkeypatch.setattr(plan_cli, "call", fake)
    code, out, err = run(capsys, "start", "--gallery", "my gallery", "--version", "v2", "--wait",
                         "--poll", "0.001", "--gateway", "http://g:1")
    assert code == 1
    assert calls[0] == ("POST", "/v1/galleries/my%20gallery/plans", {"new": {"version": "v2"}})
    assert [c[:2] for c in calls[1:]] == [("GET", "/v1/galleries/my%20gallery/plans/job-1")] * 3
    assert err.splitlines() == ["job-1: queued", "job-1: running (embed)", "job-1: failed",
                                "error: plan job-1 failed: out of memory"]
    assert "error        out of memory" in out


def _apply_with(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                jobs: list[dict[str, Any]], *extra: str) -> tuple[int, str, str, list]:
    """``plan apply --wait`` against answers: the apply's, then the job's as polled."""
    applied = {"option": "route:procrustes", "plan": "job-p", "job": jobs[0]}
    answers = iter([applied, *jobs])
    calls: list = []

    def fake(gateway: str, method: str, path: str, key: str | None = None,
             body: Any = None, timeout: float = 60) -> Any:
        calls.append((method, path))
        return next(answers, jobs[-1])

    monkeypatch.setattr(plan_cli, "call", fake)
    code, out, err = run(capsys, "apply", "--gallery", "demo", "job-p", "route:procrustes",
                         "--wait", "--poll", "0.001", "--gateway", "http://g:1", *extra)
    return code, out, err, calls


def test_apply_wait_ends_with_the_jobs_outcome(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """--wait polls the job the option started until it ends: 0 when its version was
    promoted; 1, saying why, when its gate kept the gallery as it was."""
    job = {"id": "job-a", "kind": "adapter", "status": "queued", "gallery": "demo"}
    done = {**job, "status": "succeeded", "version": "v2-route", "auto_promote": True}
    code, out, err, calls = _apply_with(monkeypatch, capsys, [
        job, {**job, "status": "running"}, {**done, "promoted": True,
                                             "gate": {"passed": True, "checks": []}}])
    assert code == 0 and "promoted" in out and "yes: v2-route serves gallery demo" in out
    assert calls[0] == ("POST", "/v1/galleries/demo/plans/job-p/apply")
    assert all(c == ("GET", "/v1/jobs/job-a") for c in calls[1:])
    code, out, err, _ = _apply_with(monkeypatch, capsys, [
        job, {**done, "promoted": False, "gate": {"passed": False, "reason": "worse"}}])
    assert code == 1 and "no: gallery demo is served as before" in out
    assert "the gate did not pass" in err


def test_apply_wait_stops_at_its_timeout_and_on_a_failed_job(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    job = {"id": "job-a", "kind": "adapter", "status": "running", "gallery": "demo"}
    code, _, err, _ = _apply_with(monkeypatch, capsys, [job], "--timeout", "0.05")
    assert code == 1 and "still running after 0.05 s" in err
    code, _, err, _ = _apply_with(monkeypatch, capsys, [
        job, {**job, "status": "failed", "error": "out of memory"}])
    assert code == 1 and "job job-a failed: out of memory" in err
