"""``nobackfill bench host-report DIR``: the table of a host check (``deploy/gpu-check.sh``).

The check writes into ``DIR`` what each part measured (``bench-base.json``,
``bench-migrate.json``, ``bench-rerank.json``, ``bench-serve.json``, each part's
``*.seconds`` and exit status, and ``gpu-util.csv``: the GPU's utilisation sampled by
``nvidia-smi`` while the parts ran); this reads them and prints one table: the device,
each part's time and status, the GPU's utilisation (mean and peak), the NEW encoder's
items/s and the backfill's, their ratio, search p50/p99 idle and during the migration,
cold and warm rerank ratios, and bench serve's text search at one client. A part that
did not run or did not finish says so in its row.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

from training.console import report_command

PARTS = ("tests", "bench-base", "distributed", "bench-migrate", "bench-rerank", "bench-serve")


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="the table of a host check (deploy/gpu-check.sh's folder)")
    p.add_argument("dir", help="the check's output folder (its $OUT)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))


def run(args: argparse.Namespace) -> dict[str, Any]:
    return collect(Path(args.dir))


def _json(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
        return json.loads(text[text.index("{"):]) if "{" in text else None
    except (OSError, ValueError):
        return None


def _part(folder: Path, name: str) -> dict[str, Any]:
    """One part's exit status and seconds (``NAME.status``: "EXIT SECONDS")."""
    try:
        code, seconds = (folder / f"{name}.status").read_text().split()[:2]
        return {"exit": int(code), "seconds": round(float(seconds), 1),
                "timed_out": int(code) in (124, 137)}
    except (OSError, ValueError):
        return {"exit": None, "seconds": None, "timed_out": False}


def utilisation(path: Path) -> dict[str, Any] | None:
    """Mean and peak of ``nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,
    nounits -lms N`` samples (None: no GPU sampled)."""
    try:
        with open(path, newline="") as f:
            values = [float(row[0]) for row in csv.reader(f) if row and row[0].strip()
                      .replace(".", "", 1).isdigit()]
    except OSError:
        return None
    if not values:
        return None
    return {"mean_pct": round(sum(values) / len(values), 1), "peak_pct": max(values),
            "samples": len(values)}


def collect(folder: Path) -> dict[str, Any]:
    """What the check's parts wrote, as one record (missing parts: None)."""
    base = _json(folder / "bench-base.json")
    migrate = _json(folder / "bench-migrate.json")
    rerank = _json(folder / "bench-rerank.json")
    serve = _json(folder / "bench-serve.json")
    out: dict[str, Any] = {"parts": {p: _part(folder, p) for p in PARTS},
                           "gpu": utilisation(folder / "gpu-util.csv")}
    device = next((r.get("device") for r in (migrate, rerank, serve) if r and r.get("device")),
                  None)
    out["device"] = device
    host = (folder / "gpu.txt").read_text().strip() if (folder / "gpu.txt").is_file() else ""
    out["host"] = host.splitlines()[0] if host else None
    if base:
        out["base"] = {n: {"t2i": base[n]["t2i"]["R@1"], "i2t": base[n]["i2t"]["R@1"],
                           "seconds": base[n].get("seconds")} for n in ("old", "new")
                       if n in base}
    if migrate:
        enc, a, b = migrate["encoder"], migrate["run_a"], migrate["run_b"]
        out["migrate"] = {
            "items": migrate["items"], "encoder_items_per_s": enc["items_per_s"],
            "encoder_from_files_items_per_s": enc.get("from_files_items_per_s"),
            "backfill_items_per_s": a["backfill_items_per_s"],
            "ratio": round(a["backfill_items_per_s"] / enc["items_per_s"], 3)
            if enc["items_per_s"] else None,
            "idle_p50_ms": migrate["idle"]["p50_ms"], "idle_p99_ms": migrate["idle"]["p99_ms"],
            "during_p50_ms": b["search"]["p50_ms"], "during_p99_ms": b["search"]["p99_ms"],
            "p99_ratio": round(b["search"]["p99_ms"] / migrate["idle"]["p99_ms"], 3)
            if migrate["idle"]["p99_ms"] else None,
            "reads": bool(migrate.get("reads"))}
    if rerank:
        rounds = rerank["rerank"].get("20", {}).get("rounds") or []
        out["rerank"] = {
            "items": rerank["items"], "plain_p50_ms": rerank["plain"]["p50_ms"],
            "cold_20": [r["cold"]["ratio"] for r in rounds],
            "warm_20": [r["warm"]["ratio"] for r in rounds],
            "cold_stages_ms": rounds[0]["cold"]["stages_p50_ms"] if rounds else None}
    if serve:
        one = min(serve["batched"]["text"], key=int)
        cell = serve["batched"]["text"][one]
        out["serve"] = {"clients": int(one), "text_p50_ms": round(cell["p50_ms"], 2),
                        "text_qps": round(cell["qps"], 1)}
    return out


def _ms(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, int | float) else "-"


def _ratios(values: list[float]) -> str:
    from service.bench.rerank import spread

    return spread(values)["text"] if values else "-"


def render(r: dict[str, Any]) -> str:
    gpu = r.get("gpu")
    lines = [f"host check: device {r.get('device') or '-'}"
             + (f"; {r['host']}" if r.get("host") else ""), "",
             "| part | exit | seconds |", "|---|---|---|"]
    for name, part in r["parts"].items():
        status = ("not run" if part["exit"] is None else
                  f"{part['exit']} (time limit)" if part["timed_out"] else str(part["exit"]))
        lines.append(f"| {name} | {status} | {_ms(part['seconds'])} |")
    m, rr, s = r.get("migrate") or {}, r.get("rerank") or {}, r.get("serve") or {}
    lines += ["", "| figure | value |", "|---|---|",
              "| GPU utilisation, mean / peak | " + (f"{gpu['mean_pct']}% / {gpu['peak_pct']}% "
                                                   f"({gpu['samples']} samples)" if gpu
                                                   else "- (no GPU sampled)") + " |"]
    for n, cell in (r.get("base") or {}).items():
        lines.append(f"| bench base {n.upper()}: R@1 t2i / i2t, seconds | {cell['t2i']:.3f} / "
                     f"{cell['i2t']:.3f}, {_ms(cell['seconds'])} |")
    if m:
        lines += [(f"| NEW encoder items/s (preloaded / reading files) | "
                  f"{_ms(m['encoder_items_per_s'])} / {_ms(m['encoder_from_files_items_per_s'])} |"),
                  (f"| backfill items/s ({m['items']:,} items), ratio to the encoder | "
                  f"{_ms(m['backfill_items_per_s'])}, {m['ratio']}x |"),
                  (f"| search p50 / p99 ms, idle | {_ms(m['idle_p50_ms'])} / "
                  f"{_ms(m['idle_p99_ms'])} |"),
                  (f"| search p50 / p99 ms, during the migration"
                  f"{' (reranked)' if m['reads'] else ''} | {_ms(m['during_p50_ms'])} / "
                  f"{_ms(m['during_p99_ms'])} (p99 {m['p99_ratio']}x idle) |")]
    if rr:
        stages = rr.get("cold_stages_ms") or {}
        lines += [f"| rerank@20 cold / plain p50 (median of rounds) | {_ratios(rr['cold_20'])} |",
                  f"| rerank@20 warm / plain p50 | {_ratios(rr['warm_20'])} |",
                  f"| plain search p50 ms ({rr['items']:,} items) | {_ms(rr['plain_p50_ms'])} |",
                  "| a cold rerank@20's stages, p50 ms | " + (", ".join(
                      f"{k} {v:.1f}" for k, v in stages.items()) or "-") + " |"]
    if s:
        lines.append(f"| bench serve text search at {s['clients']} client: p50 ms, QPS | "
                     f"{_ms(s['text_p50_ms'])}, {s['text_qps']} |")
    return "\n".join(lines)
