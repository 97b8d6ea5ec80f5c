"""The demo's output: a printed table per step, ``report.md`` and PNG plots.

Every table is built once as rows and rendered twice: as aligned text for the terminal
and as Markdown for the report.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from service.stack.demo.probe import TOP_K, Measurement
from service.stack.demo.story import MigrationStep, Step, Story
from service.stack.demo.world import ALL_DOMAINS, NEW_LANGUAGE

GROUPS = (*ALL_DOMAINS, NEW_LANGUAGE)
Table = tuple[list[str], list[list[str]]]


def text(table: Table) -> str:
    header, rows = table
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    return "\n".join("  ".join(s.ljust(w) for s, w in zip(r, widths)).rstrip()
                     for r in [header, *rows])


def markdown(table: Table) -> str:
    header, rows = table
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(r) + " |" for r in rows)])


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# ------------------------------------------------------------------------ tables
def gate_table(gate: dict[str, Any]) -> Table:
    """The gate's checks, then its negative-flip rate per direction (queries the incumbent
    answered right at top-1 and the candidate gets wrong) against its bound, if any."""
    rows = [[c["subset"], c["direction"], _num(c["new_to_old"]), _num(c["old_to_old"]),
             _num(c["required"]), "yes" if c["passed"] else "NO"] for c in gate["checks"]
            if c.get("metric") != "negative flip"]
    bound = gate.get("max_negative_flip")
    for direction, rate in (gate.get("negative_flip") or {}).items():
        ok = "-" if bound is None else ("yes" if rate <= bound else "NO")
        rows.append(["negative flips", direction, _num(rate), "-",
                     "off" if bound is None else f"<= {_num(bound)}", ok])
    return (["gate check", "direction", "new->old R@1", "old->old R@1", "required", "passed"],
            rows)


def recall_table(rows: Sequence[tuple[str, Measurement]]) -> Table:
    """One row per (label, measurement): R@1 (R@5) per domain and the new language."""
    header = ["answered by", "route", *GROUPS, "items", "top-1 hits embedded by"]
    out = []
    for label, m in rows:
        cells = []
        for group in GROUPS:
            cell = m.recall.get(group)
            cells.append("-" if not cell or not cell["queries"]
                         else f"{cell['R@1']:.2f} ({cell[f'R@{TOP_K}']:.2f})")
        total = sum(m.embedded_by.values()) or 1
        by = ", ".join(f"{v} {n / total:.0%}" for v, n in sorted(m.embedded_by.items()))
        out.append([label, m.route, *cells, str(m.items), by])
    return header, out


def fingerprint_table(story: Story) -> Table:
    """Day 0's items, by the version that embedded them, at day 0 and at the end; then
    every item the gallery holds at the end."""
    fp = story.fingerprints
    day0, end, every = fp.get("day 0", {}), fp.get("end", {}), fp.get("end, every item", {})
    rows = []
    for version in dict.fromkeys([*day0, *end]):
        a, b = day0.get(version), end.get(version)
        rows.append([f"day 0 items, embedded by {version}", str((a or {}).get("items", 0)),
                     str((b or {}).get("items", 0)), a["sha256"][:16] if a else "-",
                     b["sha256"][:16] if b else "-", "yes" if a == b else "NO"])
    for version, f in every.items():
        rows.append([f"at the end, embedded by {version}", "", str(f["items"]), "", "", ""])
    for version, f in fp.get("migrated side", {}).items():
        rows.append([f"the migrated side, embedded by {version}", "", str(f["items"]), "",
                     f["sha256"][:16], ""])
    return ["stored vectors", "items at day 0", "items at the end", "sha256 at day 0",
            "sha256 at the end", "unchanged"], rows


def matrix_table(matrix: dict[str, Any]) -> Table:
    models, cells = matrix["models"], matrix["cells"]

    def cell(q: str, g: str) -> str:
        c = cells[q][g]
        return "no route" if c is None else f"{c['t2i']['R@1']:.3f} / {c['i2t']['R@1']:.3f}"
    return (["query \\ gallery (t2i / i2t R@1)", *models],
            [[q, *(cell(q, g) for g in models)] for q in models])


def migration_table(step: MigrationStep) -> Table:
    """The same queries before (routed into the old space), after (native, against the
    re-embedded side) and after the migration rollback (routed again)."""
    rows = [(label, m) for label, m in (("before: routed", step.before),
                                        ("after: migrated", step.after),
                                        ("after rollback: routed", step.rolled_back))
            if m is not None]
    header, table = recall_table([(label, m) for label, m in rows])
    return ([header[0], "version", "route", "space", *header[2:]],
            [[r[0], m.version, r[1], m.space, *r[2:]] for r, (_, m) in zip(table, rows)])


def migration_gate_table(gate: dict[str, Any]) -> Table:
    """The migration gate: new->new (migrated) against the route new->old, R@1."""
    return (["migration gate", "migrated (new->new) R@1", "routed (new->old) R@1", "passed"],
            [[c["direction"], _num(c["migrated"]), _num(c["routed"]),
              "yes" if c["passed"] else "NO"] for c in gate.get("checks") or []])


def progress_table(samples: list[dict[str, Any]], most: int = 8) -> Table:
    """The migration's progress as polled (at most ``most`` rows, the last one kept)."""
    if len(samples) > most:
        step = (len(samples) - 1) / (most - 1)
        samples = [samples[round(k * step)] for k in range(most)]

    def opt(value: Any, unit: str = "") -> str:
        return "-" if value is None else f"{value}{unit}"
    return (["t", "state", "stage", "done/total", "items/s", "ETA", "applied", "unreadable"],
            [[f"{s['t_s']:.1f} s", s["state"], opt(s["stage"]), f"{s['done']}/{s['total']}",
              opt(s["items_per_s"]), opt(s["eta_s"], " s"), opt(s["applied"]),
              opt(s["unreadable"])] for s in samples])


def migration_parts(step: MigrationStep) -> list[tuple[str, Table | None]]:
    """(caption, table) pairs of the migration step; a None table is a line of text."""
    if step.skipped:
        return [(f"skipped: {step.skipped}", None)]
    parts: list[tuple[str, Table | None]] = []
    if step.progress:
        parts.append(((f"progress of job {step.job} (GET /v1/galleries/{{gallery}}/migration, "
                      "polled)"), progress_table(step.progress)))
    gate = step.gate or {}
    verdict = "PASSED" if gate.get("passed") else "FAILED"
    action = "switched" if step.switched else "NOT switched"
    if gate.get("checks"):
        parts.append((f"migration gate {verdict} -> {action}", migration_gate_table(gate)))
    else:
        parts.append(((f"migration gate {verdict} -> {action}: "
                      f"{gate.get('reason') or 'no gate report'}"), None))
    parts.append((f"text queries before and after the migration (R@1, R@{TOP_K} in brackets)",
                  migration_table(step)))
    parts += [(note, None) for note in step.notes]
    return parts


def step_tables(step: Step) -> list[tuple[str, Table | None]]:
    """(caption, table) pairs of one step; a None table is a line of text."""
    parts: list[tuple[str, Table | None]] = []
    if step.gate is not None:
        verdict = "PASSED" if step.gate.get("passed") else "FAILED"
        action = "promoted" if step.promoted else "not promoted"
        if "checks" in step.gate:
            parts.append((f"candidate {step.version}: gate {verdict} -> {action}",
                          gate_table(step.gate)))
        else:
            parts.append(((f"candidate {step.version}: gate {verdict}: "
                          f"{step.gate.get('reason')}"), None))
    if step.measurement is not None:
        m = step.measurement
        parts.append(((f"text queries answered by {m.version} against gallery (R@1, R@{TOP_K} "
                      f"in brackets)"), recall_table([(m.version, m)])))
    parts += [(note, None) for note in step.notes]
    return parts


# ------------------------------------------------------------------------ printing
def step_text(step: Step, index: int, total: int) -> str:
    lines = [f"== step {index}/{total}: {step.title} ({step.seconds:.0f} s) =="]
    for caption, table in step_tables(step):
        lines.append(caption)
        if table is not None:
            lines.append(text(table))
    return "\n".join(lines)


def total_steps(story: Story) -> int:
    """The steps as printed: each Step, every version, the migration."""
    return len(story.steps) + 2


def end_text(story: Story) -> str:
    n = len(story.steps)
    lines = [(f"== step {n + 1}/{n + 2}: every version answers the same gallery (rolled back "
              "to each in turn) =="), text(recall_table(list(story.by_version.items())))]
    if story.migration is not None:
        m = story.migration
        lines.append(f"== step {n + 2}/{n + 2}: {m.title} ({m.seconds:.0f} s) ==")
        for caption, table in migration_parts(m):
            lines.append(caption)
            if table is not None:
                lines.append(text(table))
    lines += [("stored vectors of the serving side, day 0 against the end (never re-embedded; "
               "a migration writes a separate side):"), text(fingerprint_table(story))]
    if story.matrix:
        lines += [("compatibility matrix on the validation set (query model through its route "
                  "into the gallery model's space):"), text(matrix_table(story.matrix))]
    lines.append(f"demo finished in {story.seconds / 60:.1f} min; report: "
                 f"{story.out / 'report.md'}")
    return "\n".join(lines)


# ------------------------------------------------------------------------ report.md
def write_report(story: Story) -> Path:
    plots = write_plots(story)
    md = ["# nobackfill demo", "",
          (f"Profile `{story.profile.name}`, finished in {story.seconds / 60:.1f} min. Every "
          "query below went through the gateway's search API against gallery `demo`, whose "
          "old-domain vectors v1 embedded at day 0 and which was never re-embedded, until "
          "the last step migrated it into a separate side."), ""]
    for n, step in enumerate(story.steps, 1):
        md += [f"## Step {n}: {step.title}", "", f"Wall time {step.seconds:.0f} s.", ""]
        for caption, table in step_tables(step):
            md += [caption + ("" if table is None else ":"), ""]
            if table is not None:
                md += [markdown(table), ""]
        if step.version in plots:
            md += [f"![compatibility of {step.version}]({plots[step.version].name})", ""]
    md += ["## Every version against the same gallery", "",
           ("Each version that served was made active again (rollback) and answered the same "
           f"queries: R@1 (R@{TOP_K})."), "", markdown(recall_table(list(story.by_version.items()))),
           "", f"![recall per domain over the phases]({plots['recall'].name})", ""]
    if story.migration is not None:
        m = story.migration
        md += [f"## Migration: {m.title}", "", f"Wall time {m.seconds:.0f} s.", "",
               ("The gallery is re-embedded from its items' kept sources with the active "
                "version natively, into a new side, while searches go on through the route; "
                "the migration gate compares new->new with the route new->old on the "
                "validation set, and the gallery switches when it passes. This runs last: "
                "after the switch, versions without a route into the new space cannot serve "
                "the gallery."), ""]
        for caption, table in migration_parts(m):
            md += [caption + ("" if table is None else ":"), ""]
            if table is not None:
                md += [markdown(table), ""]
    md += ["## Stored vectors", "",
           ("The serving side at day 0 and at the end (the migration wrote a separate side; "
            "its rollback made the original side serve again):"), "",
           markdown(fingerprint_table(story)), ""]
    if story.matrix:
        md += ["Compatibility matrix on the validation set:", "",
               markdown(matrix_table(story.matrix)), "", f"![compatibility]({plots['all'].name})",
               ""]
    md += ["Profile:", "", "```json", json.dumps(story.profile.to_dict(), indent=2), "```", ""]
    path = story.out / "report.md"
    path.write_text("\n".join(md), encoding="utf-8")
    (story.out / "demo.json").write_text(json.dumps(_as_json(story), indent=2, default=str))
    return path


def _as_json(story: Story) -> dict[str, Any]:
    return {"profile": story.profile.to_dict(), "seconds": story.seconds,
            "steps": [asdict(s) for s in story.steps],
            "by_version": {v: asdict(m) for v, m in story.by_version.items()},
            "fingerprints": story.fingerprints, "matrix": story.matrix,
            "migration": asdict(story.migration) if story.migration else None}


# ------------------------------------------------------------------------ plots
def write_plots(story: Story) -> dict[str, Path]:
    """recall.png, compat-all.png, and compat-VERSION.png per gated version."""
    import matplotlib

    matplotlib.use("Agg")
    out = {"recall": _recall_plot(story, story.out / "recall.png")}
    for step in story.steps:
        if step.gate and step.gate.get("matrix") and step.version:
            out[step.version] = _heatmap(step.gate["matrix"], f"gate of {step.version}",
                                         story.out / f"compat-{step.version}.png")
    if story.matrix:
        out["all"] = _heatmap(story.matrix, "every version", story.out / "compat-all.png")
    return out


def _recall_plot(story: Story, path: Path) -> Path:
    import matplotlib.pyplot as plt

    labels = [f"{s.key}\n({s.measurement.version})" for s in story.steps if s.measurement]
    fig, ax = plt.subplots(figsize=(7, 4))
    for group in GROUPS:
        ys = [s.measurement.r1(group) for s in story.steps if s.measurement]
        ax.plot(range(len(ys)), [float("nan") if y is None else y for y in ys], marker="o",
                label=group)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylim(0, 1)
    ax.set_ylabel("text->image R@1 (gateway search)")
    ax.set_title("recall per domain and language over the phases")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _heatmap(matrix: dict[str, Any], title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt
    import numpy as np

    models, cells = matrix["models"], matrix["cells"]
    fig, axes = plt.subplots(1, 2, figsize=(3 + 1.6 * len(models), 1.5 + 0.8 * len(models)))
    for ax, direction in zip(axes, ("t2i", "i2t")):
        grid = np.array([[np.nan if cells[q][g] is None else cells[q][g][direction]["R@1"]
                          for g in models] for q in models])
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
        for i in range(len(models)):
            for j in range(len(models)):
                ax.text(j, i, "-" if np.isnan(grid[i, j]) else f"{grid[i, j]:.2f}",
                        ha="center", va="center", color="white", fontsize=8)
        ax.set_xticks(range(len(models)), models, rotation=30, fontsize=8)
        ax.set_yticks(range(len(models)), models, fontsize=8)
        ax.set_xlabel("gallery model")
        ax.set_ylabel("query model")
        ax.set_title(f"{direction} R@1")
    fig.suptitle(f"compatibility: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
