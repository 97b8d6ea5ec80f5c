"""``nobackfill plan``: a gallery's upgrade plans from the shell, through the gateway's HTTP
API (/v1/galleries/{gallery}/plans), with the standard library only (``urllib.request``).

    nobackfill plan start --gallery demo --version v2 [--budget 0.1 --max-added-latency-ms 5] [--wait]
    nobackfill plan show --gallery demo PLAN_ID [--json]
    nobackfill plan list --gallery demo
    nobackfill plan apply --gallery demo PLAN_ID OPTION [--force --reason "..."] [--wait]

``start`` measures every way to the candidate version on the gallery (a ``plan`` job);
``--wait`` polls it until it ends and then shows it. ``show`` prints the plan's status
and, once done, its table of options (the share of the new model's gain each recovers
per direction with its standard error, the negative flip, the added query latency, the
compute as a fraction of a full backfill; ``*`` marks the recommended one, the others say
why not), the recommendation and why, the migration's curve, the full backfill's
estimate, and why the plan is stale (if it is). ``apply`` starts the job that makes an
option happen; a stale plan needs ``--force --reason``; ``--wait`` polls that job until it
ends and then prints its outcome: its status, the version it registered, its gate's checks
and whether the version was promoted. ``--timeout S`` (with either ``--wait``) stops
waiting after S seconds (the job goes on).

The gateway is ``--gateway`` (default ``$NOBACKFILL_GATEWAY``, else http://127.0.0.1:8000)
and the admin key ``--key`` (default ``$NOBACKFILL_API_KEY``). An error answer of the
gateway is printed with its status and message and the command exits with 1 (so does
``--wait`` when the job fails or is cancelled, when an applied route's or version's gate
fails, so the gallery is served as before, and at ``--timeout``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from service.stack.http_cli import GatewayError, add_connection_args, call, pct, share, table

ACTIONS = ("start", "show", "list", "apply")
OBJECTIVES = ("lower", "mean", "t2i", "i2t")
CONSTRAINTS = ("max_added_latency_ms", "max_negative_flip", "budget", "budget_gpu_hours")
FINISHED = ("succeeded", "failed", "cancelled")
DIRECTIONS = ("t2i", "i2t")
CURVE_AT = (0.0, 0.25, 0.5, 0.75, 1.0)  # the curve's points ``show`` prints (and the switch)


class TimedOut(Exception):
    """A ``--wait`` ran past ``--timeout``: the job goes on, only the waiting stops."""


def job_path(job_id: str) -> str:
    return f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}"


def plans_path(gallery: str, plan_id: str = "", action: str = "") -> str:
    path = f"/v1/galleries/{urllib.parse.quote(gallery, safe='')}/plans"
    if plan_id:
        path += f"/{urllib.parse.quote(plan_id, safe='')}"
    return f"{path}/{action}" if action else path


def start_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST body of ``start``: the candidate and only what was given, so the server's
    defaults apply."""
    body: dict[str, Any] = {"new": {"version": args.version}}
    for name in ("sample", "seed", "validation", "objective"):
        value = getattr(args, name, None)
        if value is not None:
            body[name] = value
    constraints = {n: getattr(args, n) for n in CONSTRAINTS if getattr(args, n) is not None}
    if constraints:
        body["constraints"] = constraints
    return body


# ------------------------------------------------------------------ rendering
def _text(value: Any) -> str:
    return "–" if value is None else str(value)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(value: Any, fmt: str = ".3g") -> str:
    return format(value, fmt) if isinstance(value, int | float) else "–"


def _worst(values: Any) -> float | None:
    numbers = [v for v in _dict(values).values() if isinstance(v, int | float)]
    return max(numbers) if numbers else None


def _ms(values: Any) -> str:
    worst = _worst(values)
    return "–" if worst is None else f"{worst:+.2f}"


def grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows under a header, each column as wide as its widest cell (the last unpadded)."""
    cells = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[c]) for r in cells) for c in range(len(header) - 1)]
    return "\n".join("  ".join([*(f"{cell:<{w}}" for cell, w in zip(r, widths, strict=False)),
                                r[-1]]).rstrip() for r in cells)


def option_rows(plan: dict[str, Any]) -> list[list[str]]:
    """The table of options: mark, name, share per direction, neg flip, +ms, compute, why not."""
    rows = []
    for o in plan.get("options") or []:
        shares = _dict(o.get("share"))
        why = o.get("why_not") or ("" if o.get("recommended") else o.get("note") or "")
        if o.get("measured") is False and o.get("note"):
            why = f"{why}: {o['note']}" if why and why != o["note"] else o["note"]
        rows.append(["*" if o.get("recommended") else "", _text(o.get("name")),
                     share(shares.get("t2i")), share(shares.get("i2t")),
                     pct(_worst(o.get("negative_flip"))), _ms(o.get("added_latency_ms")),
                     _number(_dict(o.get("compute")).get("fraction")), why])
    return rows


OPTION_HEADER = ("", "option", "share t2i", "share i2t", "neg flip", "+ms", "compute",
                 "why not")


END_HEADER = ("option", "native t2i", "native i2t", "kept t2i", "kept i2t",
              "native below", "kept gallery")


def end_rows(plan: dict[str, Any]) -> list[list[str]]:
    """Each option with an end to choose: the native side's shares against both sides
    kept with its ranking, whether the native side is below beyond the error (then the
    migration waits for the operator at its end), and the vectors both sides take."""
    rows = []
    for o in plan.get("options") or []:
        end = _dict(o.get("end"))
        if not end:
            continue
        native, kept = _dict(end.get("native")), _dict(end.get("kept"))
        rows.append([_text(o.get("name")), share(native.get("t2i")), share(native.get("i2t")),
                     share(kept.get("t2i")), share(kept.get("i2t")),
                     "yes: asks the operator" if end.get("native_below_kept") else "no",
                     f"{_dict(end.get('kept_storage')).get('gallery_bytes', 0) / 1e6:.1f} MB"])
    return rows


WARM_HEADER = ("option", "searches", "read-through alone", "candidate order (paces)",
               "applies it")


def warm_rows(plan: dict[str, Any]) -> list[list[str]]:
    """Each rerank option measured on the gallery's recorded searches: the share of the
    gallery filled when 80% of searches are fully warm, with the read-through fill alone
    and with the backfill in candidate order beside it (at each pace)."""
    rows = []
    for o in plan.get("options") or []:
        warm = _dict(o.get("warm"))
        if not warm:
            continue
        paced = " / ".join(pct(_dict(c).get("warm_80_at_filled"))
                           for c in warm.get("candidates") or [])
        order = _dict(_dict(o.get("apply")).get("params")).get("order")
        rows.append([_text(o.get("name")), _text(warm.get("searches")),
                     pct(_dict(warm.get("read_through")).get("warm_80_at_filled")), paced,
                     "yes" if order == "candidates" else "no"])
    return rows


def curve_rows(curve: dict[str, Any]) -> list[list[str]]:
    """The curve's points at ``CURVE_AT`` and at its switch: backfilled, compute, shares."""
    switch = curve.get("switch_at")
    keep = {*CURVE_AT, *([switch] if isinstance(switch, int | float) else [])}
    rows = []
    for p in curve.get("points") or []:
        f = p.get("fraction")
        if not any(isinstance(f, int | float) and abs(f - k) < 1e-9 for k in keep):
            continue
        mark = " (switch)" if isinstance(switch, int | float) and abs(f - switch) < 1e-9 else ""
        rows.append([pct(f) + mark, _number(p.get("compute")),
                     *(share(p.get(d)) for d in DIRECTIONS)])
    return rows


def _seconds(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("total")
    return f"{value:.1f} s" if isinstance(value, int | float) else "–"


def _constraints(params: dict[str, Any]) -> str:
    given = {k: v for k, v in _dict(params.get("constraints")).items() if v is not None}
    return ", ".join(f"{k} {v:g}" if isinstance(v, int | float) else f"{k} {v}"
                     for k, v in given.items()) or "none"


def _basis(basis: Any) -> str:
    b = _dict(basis)
    if not b:
        return "–"
    validation = _dict(b.get("validation")).get("path")
    return (f"{_text(b.get('items'))} items, active version {_text(b.get('incumbent'))}, "
            f"validation {_text(validation)}")


def header_rows(view: dict[str, Any]) -> list[tuple[str, str]]:
    params = _dict(view.get("params"))
    new = _dict(params.get("new"))
    candidate = new.get("version") or new.get("arch") or new.get("model_config")
    rows = [("plan", _text(view.get("id"))), ("gallery", _text(view.get("gallery"))),
            ("status", _text(view.get("status"))),
            ("candidate", f"{_text(candidate)} (objective {_text(params.get('objective'))})"),
            ("constraints", _constraints(params))]
    stage = _dict(view.get("progress")).get("stage")
    if stage and view.get("status") not in FINISHED:
        rows.append(("stage", str(stage)))
    if view.get("error"):
        rows.append(("error", str(view["error"])))
    if view.get("basis"):
        rows.append(("measured on", _basis(view.get("basis"))))
    return rows


def render(view: dict[str, Any]) -> str:
    """GET .../plans/{id} for a person."""
    parts = [table(header_rows(view))]
    plan = _dict(view.get("plan"))
    if view.get("status") != "succeeded" or not plan:
        return parts[0]
    parts.append(grid(OPTION_HEADER, option_rows(plan)))
    rec = _dict(plan.get("recommendation"))
    chosen = rec.get("option")
    parts.append(f"recommendation: {chosen if chosen else 'none'}\n  why: {_text(rec.get('why'))}")
    ends = end_rows(plan)
    if ends:
        parts.append("at the end of a migration served by rerank (the native side alone, "
                     "or both sides kept):\n" + grid(END_HEADER, ends))
    warm = warm_rows(plan)
    if warm:
        parts.append("gallery filled when 80% of searches are fully warm, on the gallery's "
                     "recorded searches (the second half is served; the candidate order is "
                     "learned from every set served before it; the backfill re-embeds the "
                     "gallery over 1x / 4x that half):\n"
                     + grid(WARM_HEADER, warm))
    curve = _dict(plan.get("curve"))
    if curve.get("points"):
        switch = curve.get("switch_at")
        when = (f"switches at {pct(switch)} of the backfill" if isinstance(switch, int | float)
                else "does not switch before the end")
        parts.append(f"curve of {_text(curve.get('option'))} ({when}):\n" + grid(
            ("backfilled", "compute", "share t2i", "share i2t"), curve_rows(curve)))
    backfill = _dict(plan.get("backfill"))
    if backfill:
        rate = backfill.get("items_per_s")
        parts.append(
            f"full backfill: {_text(backfill.get('items'))} items at "
            f"{_number(rate, '.1f')} items/s: {_number(backfill.get('seconds'), '.1f')} s "
            f"({_number(backfill.get('hours'), '.3g')} h)"
            + (f"; planned in {_seconds(plan.get('seconds'))}" if plan.get("seconds") else ""))
    stale = view.get("stale") or []
    parts.append("stale: " + ("; ".join(stale) + " (apply needs --force --reason)" if stale
                              else "no (the plan still describes the gallery)"))
    for entry in view.get("applied") or []:
        e = _dict(entry)
        parts.append(f"applied: {_text(e.get('option'))} -> {e.get('kind', 'job')} "
                     f"{_text(e.get('job'))} by {_text(e.get('by'))} at {_text(e.get('at'))}"
                     + (f" (forced: {e.get('reason')})" if e.get("forced") else ""))
    return "\n\n".join(parts)


def list_rows(views: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for v in views:
        new = _dict(_dict(v.get("params")).get("new"))
        rec = _dict(_dict(v.get("plan")).get("recommendation"))
        done = v.get("status") == "succeeded"
        rows.append([_text(v.get("id")), _text(v.get("status")), _text(v.get("created_at")),
                     _text(new.get("version") or new.get("arch")),
                     _text(rec.get("option")) if done else "–",
                     ("stale" if v.get("stale") else "current") if done else "–"])
    return rows


# ------------------------------------------------------------------ commands
def wait(gateway: str, key: str | None, gallery: str, plan_id: str, poll: float,
         status: str | None = None, sleep: Callable[[float], None] = time.sleep,
         timeout: float | None = None, path: str | None = None) -> dict[str, Any]:
    """GET the plan (or ``path``: another job's record) until it ends, each new status
    (and stage while it runs) to stderr; ``status``: the one already known (the start's
    answer). The last view; ``TimedOut`` after ``timeout`` seconds."""
    seen: tuple[Any, Any] | None = None
    if status is not None:
        seen = (status, None)
        print(f"{plan_id}: {status}", file=sys.stderr)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        view = call(gateway, "GET", path or plans_path(gallery, plan_id), key)
        finished = view.get("status") in FINISHED
        now = (view.get("status"),
               None if finished else _dict(view.get("progress")).get("stage"))
        if now != seen:
            seen = now
            print(f"{plan_id}: {now[0]}" + (f" ({now[1]})" if now[1] else ""), file=sys.stderr)
        if finished:
            return view
        if deadline is not None and time.monotonic() >= deadline:
            raise TimedOut(f"{plan_id} is still {now[0]} after {timeout:g} s; it goes on "
                           f"(GET {path or plans_path(gallery, plan_id)} follows it)")
        sleep(poll)


def _check(check: dict[str, Any]) -> str:
    """One gate check: what was measured against what it had to reach."""
    direction, ok = check.get("direction"), check.get("passed") is True
    if "migrated" in check:  # a migration's gate: the new side against the route
        return (f"{direction} migrated {_number(check['migrated'], '.3f')} "
                f"{'>=' if ok else '<'} routed {_number(check.get('routed'), '.3f')}")
    value, required = _number(check.get("new_to_old"), ".3f"), _number(check.get("required"),
                                                                       ".3f")
    if check.get("metric") == "negative flip":  # a bound from above
        return f"{direction} negative flip {value} {'<=' if ok else '>'} {required}"
    subset = check.get("subset")
    where = f" ({subset})" if subset and subset != "all" else ""
    return f"{direction} {value} {'>=' if ok else '<'} {required} required{where}"


def gate_text(gate: Any) -> str:
    """A gate report in a line: passed or failed, and each check (failed ones first)."""
    report = _dict(gate)
    verdict = "passed" if report.get("passed") is True else "failed"
    checks = [c for c in report.get("checks") or [] if isinstance(c, dict)]
    checks.sort(key=lambda c: c.get("passed") is True)
    if not checks:
        return f"{verdict}: {_text(report.get('reason'))}"
    text = f"{verdict}: " + ", ".join(_check(c) for c in checks)
    if any("required" in c and c.get("metric") != "negative flip" for c in checks):
        metric = _dict(report.get("criterion")).get("metric") or "R@1"
        text += (f" (validation {metric} of the candidate's queries; required: the serving "
                 f"version's own plus the margin)")
    return text


def outcome(job: dict[str, Any]) -> tuple[list[tuple[str, str]], str | None]:
    """An ended job's rows, and the error that makes ``apply --wait`` exit with 1 (None:
    it did what the option is for)."""
    job_id, status = _text(job.get("id")), _text(job.get("status"))
    rows = [("job", f"{job_id} ({status})")]
    if job.get("version"):
        rows.append(("version", str(job["version"])))
    if job.get("gate"):
        rows.append(("gate", gate_text(job["gate"])))
    error = None
    if status != "succeeded":
        error = f"job {job_id} {status}" + (f": {job['error']}" if job.get("error") else "")
    elif job.get("auto_promote") and job.get("version"):
        gallery = _text(job.get("gallery"))
        if job.get("promoted"):
            rows.append(("promoted", f"yes: {job['version']} serves gallery {gallery}"))
        else:
            rows.append(("promoted", f"no: gallery {gallery} is served as before"))
            error = (f"job {job_id}: the gate did not pass, so {job['version']} is registered "
                     f"but does not serve gallery {gallery}")
    if job.get("error"):
        rows.append(("error", str(job["error"])))
    return rows, error


def run(args: argparse.Namespace, out: Any = None) -> int:
    """One action; prints to ``out`` (stdout) and errors to stderr; the exit code."""
    out = out or sys.stdout
    gateway, key, gallery = args.gateway, args.key, args.gallery
    try:
        if args.action == "start":
            job = call(gateway, "POST", plans_path(gallery), key, start_body(args))
            if not args.wait:
                text = (f"started plan {job.get('id')} of {gallery} ({job.get('status')}); "
                        f"see it with: nobackfill plan show {gallery} {job.get('id')}")
                print(json.dumps(job, indent=2) if args.json else text, file=out)
                return 0
            view = wait(gateway, key, gallery, str(job.get("id")), args.poll, job.get("status"),
                        timeout=args.timeout)
            print(json.dumps(view, indent=2) if args.json else render(view), file=out)
            if view.get("status") != "succeeded":
                print(f"error: plan {view.get('id')} {view.get('status')}"
                      + (f": {view['error']}" if view.get("error") else ""), file=sys.stderr)
                return 1
            return 0
        if args.action == "show":
            view = call(gateway, "GET", plans_path(gallery, args.plan_id), key)
            print(json.dumps(view, indent=2) if args.json else render(view), file=out)
            return 0
        if args.action == "list":
            views = call(gateway, "GET", plans_path(gallery), key)
            if args.json:
                print(json.dumps(views, indent=2), file=out)
            elif not views:
                print(f"gallery {gallery} has no plans", file=out)
            else:
                print(grid(("plan", "status", "created", "candidate", "recommended", "basis"),
                           list_rows(views)), file=out)
            return 0
        # apply
        body = {"option": args.option, "force": args.force, "reason": args.reason}
        done = call(gateway, "POST", plans_path(gallery, args.plan_id, "apply"), key, body)
        job = _dict(done.get("job"))
        if args.json and not getattr(args, "wait", False):
            print(json.dumps(done, indent=2), file=out)
            return 0
        if not args.json:
            text = (f"applied option {done.get('option')} of plan {done.get('plan')}: started "
                    f"{_text(job.get('kind'))} job {_text(job.get('id'))} "
                    f"({_text(job.get('status'))})")
            if done.get("forced") and done.get("stale"):
                text += "\nforced although the plan is stale: " + "; ".join(done["stale"])
            print(text, file=out, flush=True)
        if not (getattr(args, "wait", False) and job.get("id")):
            return 0
        ended = wait(gateway, key, gallery, str(job["id"]), args.poll, job.get("status"),
                     timeout=args.timeout, path=job_path(str(job["id"])))
    except (GatewayError, TimedOut) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows, error = outcome(ended)
    print(json.dumps(ended, indent=2) if args.json else table(rows), file=out)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def register(sub: argparse._SubParsersAction, name: str) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gallery", required=True)
    add_connection_args(common)
    p = sub.add_parser(name, help="plan a gallery's upgrade to a new model through the "
                                  "gateway: measure every option, show, apply one",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", parents=[common], help="measure every way to a "
                               "candidate version on the gallery (a plan job)")
    start.add_argument("--version", required=True, help="the candidate: a registered version")
    start.add_argument("--sample", type=int, help="gallery items the candidate embeds to fit "
                       "the adapters and the transform (default 2%% of the gallery)")
    start.add_argument("--seed", type=int)
    start.add_argument("--validation", help="validation data (default: the gallery's)")
    start.add_argument("--objective", choices=OBJECTIVES, help="what an option is ranked by: "
                       "the lower of the two directions' shares (the server's default), "
                       "their mean, or one direction")
    start.add_argument("--max-added-latency-ms", type=float,
                       help="per query, over the old model's own")
    start.add_argument("--max-negative-flip", type=float,
                       help="per direction, a rate in [0, 1]")
    start.add_argument("--budget", type=float,
                       help="compute, as a fraction of a full backfill")
    start.add_argument("--budget-gpu-hours", type=float, help="compute in device-hours")
    _wait_args(start, "poll until the plan ends, then show it", "the plan")
    show = actions.add_parser("show", parents=[common], help="a plan: its status and, once "
                              "done, its options, recommendation, curve and staleness")
    show.add_argument("plan_id", metavar="PLAN_ID")
    actions.add_parser("list", parents=[common], help="the gallery's plans, newest first")
    apply = actions.add_parser("apply", parents=[common], help="start the job that makes one "
                               "of the plan's options happen")
    apply.add_argument("plan_id", metavar="PLAN_ID")
    apply.add_argument("option", metavar="OPTION", help="an option's name, e.g. route:affine")
    apply.add_argument("--force", action="store_true", help="apply although the plan is "
                                                            "stale (needs --reason)")
    apply.add_argument("--reason", help="recorded with the apply")
    _wait_args(apply, "poll the job it starts until it ends, then print its outcome (exit 1 "
                      "if it failed, was cancelled, or its gate kept its version from "
                      "serving)", "the job")
    p.set_defaults(func=run)


def _wait_args(parser: argparse.ArgumentParser, wait: str, what: str) -> None:
    """--wait, --poll and --timeout (``what`` goes on when the waiting stops)."""
    parser.add_argument("--wait", action="store_true", help=wait)
    parser.add_argument("--poll", type=_positive, default=2.0, metavar="S",
                        help="seconds between polls with --wait (default 2)")
    parser.add_argument("--timeout", type=_positive, metavar="S",
                        help=f"with --wait: stop waiting after S seconds, exit 1 ({what} "
                             f"goes on; default: wait until it ends)")
