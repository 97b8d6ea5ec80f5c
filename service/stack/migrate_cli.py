"""``nobackfill migrate``: a gallery's managed migration from the shell, through the
gateway's HTTP API (POST/GET /v1/galleries/{gallery}/migration and its actions), with the
standard library only (``urllib.request``), so it runs wherever the package is installed.

    nobackfill migrate start --gallery demo --transform --order learned --switch progressive
    nobackfill migrate status --gallery demo [--json]
    nobackfill migrate switch|rollback|retire|cancel|resume --gallery demo
    nobackfill migrate keep --gallery demo --mode rerank

The gateway is ``--gateway`` (default ``$NOBACKFILL_GATEWAY``, else http://127.0.0.1:8000)
and the admin key ``--key`` (default ``$NOBACKFILL_API_KEY``). An error answer of the
gateway is printed with its status and message (``{"error": {"code", "message"}}``) and
the command exits with 1."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from service.stack.http_cli import (  # noqa: F401  (re-exported: the names this module had)
    DEFAULT_GATEWAY,
    GatewayError,
    add_connection_args,
    call,
    shown,
    table,
)
from service.stack.http_cli import pct as _pct
from service.stack.http_cli import share as _share

ACTIONS = ("start", "status", "switch", "rollback", "retire", "cancel", "pause", "resume",
           "keep")


def migration_path(gallery: str, action: str = "") -> str:
    base = f"/v1/galleries/{urllib.parse.quote(gallery, safe='')}/migration"
    return f"{base}/{action}" if action else base


def start_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST body of ``start``: only what was given, so the server's defaults apply."""
    body: dict[str, Any] = {}
    for name in ("shards", "batch_size", "rate_limit", "order", "switch", "sample",
                 "validation", "seed", "serving", "rerank_k", "backfill"):
        value = getattr(args, name, None)
        if value is not None:
            body[name] = value
    if args.transform:
        body["transform"] = True
    if args.method:
        body["transform_config"] = {"method": args.method}
    if args.no_auto_switch:
        body["auto_switch"] = False
    return body


# ------------------------------------------------------------------ status table
def _estimate(estimate: Any) -> str:
    if not isinstance(estimate, dict):
        return "–"
    parts = []
    for direction in ("t2i", "i2t"):
        d = estimate.get(direction)
        share = d.get("share") if isinstance(d, dict) else None
        parts.append(f"{direction} {_share(share)}")
    return ", ".join(parts) + f" (curve at {_pct(estimate.get('fraction'))})"


def status_rows(view: dict[str, Any]) -> list[tuple[str, str]]:
    """GET .../migration as (field, value) rows."""
    p = view.get("progress") if isinstance(view.get("progress"), dict) else {}
    source, target = view.get("source") or {}, view.get("target") or {}

    def text(value: Any) -> str:
        return "–" if value is None else str(value)

    switched = p.get("switched_at_fraction")
    if switched is not None:
        switch = f"switched at {_pct(switched)} ({text(p.get('switched_at'))})"
    elif p.get("switch_at") is not None:
        switch = f"switches at {_pct(p.get('switch_at'))}"
    elif p.get("switch") == "progressive":
        switch = "no progressive switch (the side never beats the route on validation)"
    else:
        switch = "at the end" if view.get("state") == "backfilling" else "–"
    transform = p.get("transform") if isinstance(p.get("transform"), dict) else None
    rows = [("gallery", text(view.get("gallery"))), ("state", text(view.get("state"))),
            ("phase", text(view.get("phase"))),
            ("serving mode", text(view.get("serving")) + (
                f" (k {view['rerank_k']})" if view.get("rerank_k") else "")),
            ("allowed now", ", ".join(view.get("options") or []) or "–"),
            ("job", f"{text(view.get('job'))} ({text(view.get('job_status'))})"),
            ("sides", (f"{text(source.get('space'))} -> {text(target.get('space'))} "
                      f"with {text(view.get('version'))}")),
            ("serving space", text(view.get("serving_space"))),
            ("stage", text(p.get("stage")) + (" (paused)" if p.get("paused") else "")),
            ("filled", (f"by reads {text(p.get('filled_by_reads'))}, by the backfill "
                       f"{text(p.get('filled_by_backfill'))}")),
            ("done", f"{text(p.get('done'))}/{text(p.get('total'))}"),
            ("fraction", _pct(p.get("fraction"))),
            ("order", text(p.get("order"))), ("switch mode", text(p.get("switch"))),
            ("transformed", text(p.get("transformed"))),
            ("switch", switch)]
    if transform is not None:
        rows.append(("transform", (f"{text(transform.get('method'))}, sample "
                                  f"{text(transform.get('sample'))}")))
    if isinstance(p.get("candidates"), dict):
        c = p["candidates"]
        rows.append(("retrieved first", (f"{text(c.get('first'))} of {text(c.get('left'))} "
                                        f"item(s), counts as of the {text(c.get('planned'))}")))
    if "share_estimate" in p:
        rows.append(("share now", _estimate(p.get("share_estimate"))))
    if isinstance(p.get("items_per_s"), int | float):
        rows.append(("items/s", f"{p['items_per_s']:.1f}"))
    if isinstance(p.get("eta_s"), int | float):
        rows.append(("eta", f"{p['eta_s']:.0f} s"))
    result = view.get("result") if isinstance(view.get("result"), dict) else {}
    if result.get("switch_refused"):
        rows.append(("not switched", str(result["switch_refused"])))
    if view.get("job_error"):
        rows.append(("job error", str(view["job_error"])))
    rows += end_rows(view.get("end"))
    return rows


def end_rows(end: Any) -> list[tuple[str, str]]:
    """The end states the gate measured, as rows: each choice's R@1, whether the native
    side is below it, and what keeping both sides costs."""
    if not isinstance(end, dict):
        return []
    rows = []
    for choice in end.get("choices") or []:
        r1 = ", ".join(f"{d} {v:.3f}" for d, v in (choice.get("R@1") or {}).items())
        below = " (the native side is below it beyond the error)" \
            if choice.get("native_below") else ""
        rows.append((f"end: {choice.get('end')}", f"R@1 {r1}{below}; {choice.get('action')}"))
    cost = end.get("cost_of_keeping") or {}
    if cost.get("vector_bytes_both") is not None:
        rows.append(("cost of keeping", (
            f"vectors {cost['vector_bytes_both'] / 1e6:.1f} MB for both sides against "
            f"{cost['vector_bytes_one_side'] / 1e6:.1f} MB for one; "
            f"{cost.get('embeddings_per_write')} embeddings per write")))
    return rows


# ------------------------------------------------------------------ commands
def run(args: argparse.Namespace, out: Any = None) -> int:
    """One action; prints to ``out`` (stdout) and errors to stderr; the exit code."""
    out = out or sys.stdout
    gateway, key, gallery = args.gateway, args.key, args.gallery
    try:
        if args.action == "start":
            answer = call(gateway, "POST", migration_path(gallery), key, start_body(args))
            return shown(answer, args.json, out, f"started migration job {answer.get('id')} "
                         f"of {gallery} ({answer.get('status')})")
        if args.action == "status":
            view = call(gateway, "GET", migration_path(gallery), key)
        elif args.action == "switch":
            view = call(gateway, "POST", migration_path(gallery, "switch"), key,
                        {"drop": args.drop, "force": args.force, "reason": args.reason})
        elif args.action == "rollback":
            view = call(gateway, "POST", migration_path(gallery, "rollback"), key,
                        {"reason": args.reason})
        elif args.action == "retire":
            answer = call(gateway, "POST", migration_path(gallery, "retire"), key)
            return shown(answer, args.json, out, f"retired: the {answer['dropped']['space']} "
                         f"side of {gallery} was deleted; it serves in space {answer['space']}")
        elif args.action == "keep":
            view = call(gateway, "POST", migration_path(gallery, "keep"), key,
                        {"mode": args.mode, "rerank_k": args.rerank_k, "reason": args.reason})
        elif args.action in ("pause", "resume"):
            view = call(gateway, "POST", migration_path(gallery, args.action), key)
        else:  # cancel
            call(gateway, "POST", migration_path(gallery, "cancel"), key)
            print(f"cancelled the migration of {gallery}: before a switch its new side is "
                  f"dropped; after one the backfill stops (resume it)", file=out)
            return 0
    except GatewayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(view, indent=2), file=out)
    else:
        print(table(status_rows(view)), file=out)
    return 0


def register(sub: argparse._SubParsersAction, name: str) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gallery", required=True)
    add_connection_args(common)
    p = sub.add_parser(name, help="start, watch, switch, roll back, retire or cancel a "
                                  "gallery's managed migration through the gateway",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", parents=[common], help="start a migration into the "
                               "active version's native space")
    start.add_argument("--shards", type=int)
    start.add_argument("--batch-size", type=int)
    start.add_argument("--rate-limit", type=float, help="items/s over all shards (0: none)")
    start.add_argument("--transform", action="store_true", help="first fill the new side "
                       "with the stored vectors mapped into the new space")
    start.add_argument("--order", choices=("id", "random", "learned", "candidates"),
                       help="backfill order (learned needs --transform; candidates, without "
                            "it: the items users retrieved most often first)")
    start.add_argument("--switch", choices=("end", "progressive"),
                       help="when to switch (progressive needs --transform)")
    start.add_argument("--sample", type=int, help="items the new version embeds to fit the "
                                                  "map (default 2%% of the gallery)")
    start.add_argument("--method", choices=("procrustes", "affine", "residual-mlp"),
                       help="the transform's map (transform_config.method)")
    start.add_argument("--validation", help="validation data (default: the gallery's)")
    start.add_argument("--seed", type=int)
    start.add_argument("--serving", choices=("route", "rerank"), help="how searches are "
                       "answered while the new side fills (rerank: the route's top candidates "
                       "ranked by the new model, filled on read)")
    start.add_argument("--rerank-k", type=int, help="candidates a reranked search ranks")
    start.add_argument("--backfill", choices=("run", "paused"), help="paused: a lazy "
                       "migration (the bulk backfill waits for resume; reranked searches "
                       "fill the new side meanwhile)")
    start.add_argument("--no-auto-switch", action="store_true",
                       help="do not switch by itself at the end")
    actions.add_parser("status", parents=[common], help="the migration's progress")
    switch = actions.add_parser("switch", parents=[common], help="switch to the new side")
    switch.add_argument("--force", action="store_true", help="skip the gate (needs --reason)")
    switch.add_argument("--reason")
    switch.add_argument("--drop", nargs="*", default=[], metavar="ID",
                        help="items without a new vector to delete from both sides")
    rollback = actions.add_parser("rollback", parents=[common], help="serve the old side again")
    rollback.add_argument("--reason")
    actions.add_parser("retire", parents=[common], help="delete the side that does not serve")
    actions.add_parser("cancel", parents=[common], help="before the switch: stop the "
                       "migration and drop its new side; after a progressive switch: stop "
                       "the backfill (resumable)")
    actions.add_parser("pause", parents=[common], help="pause the bulk backfill (a lazy "
                       "migration: each shard stops at its cursor)")
    actions.add_parser("resume", parents=[common], help="go on with a paused backfill, or "
                                                        "one stopped after a switch")
    keep = actions.add_parser("keep", parents=[common], help="at the end of the backfill: "
                              "keep both sides as the served mode (rerank or hybrid) "
                              "instead of switching")
    keep.add_argument("--mode", choices=("rerank", "hybrid"), required=True)
    keep.add_argument("--rerank-k", type=int, help="with rerank: candidates ranked")
    keep.add_argument("--reason")
    p.set_defaults(func=run)
