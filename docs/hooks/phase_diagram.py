"""The migration's phases and the actions between them, drawn from the lifecycle table at
every build, never by hand.

An MkDocs hook (``mkdocs.yml``: ``hooks``): ``on_files`` adds ``concepts/migration-phases.svg``,
a file that exists only in the build, drawn by ``draw`` from
``service.jobkinds.migrate.lifecycle`` (``PHASES``, ``TRANSITIONS``, ``OPERATOR``) as the
code has it when the manual is built, so the picture cannot drift from the table. The SVG
is plain Python text: no layout program, no script, nothing fetched (the manual renders
offline).

The layout is computed here:

- **Layers.** A phase's row is its distance from the start phase (``backfilling``), by
  breadth-first search over the moves; the phases no move leaves (``ended``) go on a row
  of their own at the bottom, and a phase the start cannot reach goes on the row above
  them. Within a row, phases start in the table's order and are sorted by the mean
  position of their neighbours on the rows above (a barycentre pass), which uncrosses most
  arrows.
- **Arrows.** One arrow per (phase, next phase, whose action): the actions it carries are
  its label, in the operator's colour or the applier's. Each arrow is a curve whose bend
  is chosen among a few, with its label's place along it, by the least cost: crossing a
  phase's box, running along an arrow already drawn, a label over a box or another
  label, a longer detour. A move whose target is ``a|b`` (either, decided when it happens)
  is drawn dashed to each.
- **Moves that stay in a phase** (``pause`` while backfilling) are listed inside the
  phase's box after a loop sign, in the colour of whose action they are.

``draw`` takes the table as arguments, so a test can hand it one with a phase or a move
more and find it in the picture.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape, quoteattr

OUT = "concepts/migration-phases.svg"
START = "backfilling"
OPERATOR_COLOUR = "#1c57b8"
APPLIER_COLOUR = "#c2410c"
INK = "#1f2937"
NODE_FILL = "#f3f5f9"
FONT = ("ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', "
        "'Liberation Mono', monospace")
NAME_SIZE = 15
LABEL_SIZE = 13
LOOP_SIZE = 12
CHAR = 0.61  # a monospace glyph's width, in ems
PAD_X, PAD_Y = 12, 9
ROW_STEP = 160
COLUMN_GAP = 72
SIDE = 64  # room either side of the widest row, for arrows that go around
TOP = 70
LOOP = "\u21bb"  # a clockwise loop: the action leaves the phase where it is
BENDS = (0, 28, -28, 56, -56, 90, -90, 130, -130, 180, -180, 240, -240, 310, -310)
PLACES = (0.5, 0.42, 0.58, 0.34, 0.66, 0.26, 0.74, 0.2, 0.8)
SAMPLES = 40


@dataclass
class Box:
    """A rectangle by its centre and size."""

    x: float
    y: float
    w: float
    h: float

    def inflated(self, by: float) -> Box:
        return Box(self.x, self.y, self.w + 2 * by, self.h + 2 * by)

    def holds(self, p: tuple[float, float]) -> bool:
        return abs(p[0] - self.x) <= self.w / 2 and abs(p[1] - self.y) <= self.h / 2

    def overlap(self, other: Box) -> float:
        dx = min(self.x + self.w / 2, other.x + other.w / 2) - max(self.x - self.w / 2,
                                                                   other.x - other.w / 2)
        dy = min(self.y + self.h / 2, other.y + other.h / 2) - max(self.y - self.h / 2,
                                                                   other.y - other.h / 2)
        return max(dx, 0.0) * max(dy, 0.0)

    def edge_towards(self, p: tuple[float, float]) -> tuple[float, float]:
        """Where the segment from the centre to ``p`` leaves the box."""
        dx, dy = p[0] - self.x, p[1] - self.y
        if dx == 0 and dy == 0:
            return self.x, self.y - self.h / 2
        scale = min((self.w / 2) / abs(dx) if dx else math.inf,
                    (self.h / 2) / abs(dy) if dy else math.inf)
        return self.x + dx * scale, self.y + dy * scale


@dataclass
class Move:
    """One arrow: the actions of one owner that lead from ``source`` to ``target``."""

    source: str
    target: str
    operator: bool
    either: bool  # the table's target is ``a|b``: one of them, decided when it happens
    actions: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return ", ".join(self.actions)


@dataclass
class Drawn:
    move: Move
    start: tuple[float, float]
    control: tuple[float, float]
    end: tuple[float, float]
    points: list[tuple[float, float]]
    label: Box


# ---------------------------------------------------------------- the table
def moves_of(phases: Mapping[str, str], transitions: Mapping[str, Mapping[str, str]],
             operator: Iterable[str]) -> tuple[list[Move], dict[str, list[Move]]]:
    """The arrows between phases and, per phase, the moves that stay in it; every target
    must be a phase (else ValueError: the table is wrong, the build fails)."""
    mine = set(operator)
    arrows: dict[tuple[str, str, bool, bool], Move] = {}
    loops: dict[str, dict[bool, Move]] = {}
    for source, actions in transitions.items():
        if source not in phases:
            raise ValueError(f"the lifecycle table moves from '{source}', not a phase")
        for action, spec in actions.items():
            targets = spec.split("|")
            for target in targets:
                if target not in phases:
                    raise ValueError(f"the lifecycle table moves '{source}' by '{action}' "
                                     f"to '{target}', not a phase")
                ours = action in mine
                if target == source:
                    loops.setdefault(source, {}).setdefault(
                        ours, Move(source, source, ours, False)).actions.append(action)
                    continue
                key = (source, target, ours, len(targets) > 1)
                arrows.setdefault(key, Move(*key)).actions.append(action)
    return list(arrows.values()), {p: [by[o] for o in (True, False) if o in by]
                                   for p, by in loops.items()}


def layers_of(phases: Sequence[str], moves: Sequence[Move], start: str) -> list[list[str]]:
    """Rows of phases: breadth-first depth from ``start``; the phases no move leaves at the
    bottom; those ``start`` cannot reach on the row above them."""
    if start not in phases:
        start = phases[0]
    out: dict[str, set[str]] = {p: set() for p in phases}
    for m in moves:
        out[m.source].add(m.target)
    ends = [p for p in phases if not out[p] and p != start]
    depth = {start: 0}
    frontier = [start]
    while frontier:
        following = []
        for phase in frontier:
            for target in sorted(out[phase], key=phases.index):
                if target not in depth and target not in ends:
                    depth[target] = depth[phase] + 1
                    following.append(target)
        frontier = following
    deepest = max(depth.values())
    stray = [p for p in phases if p not in depth and p not in ends]
    rows: list[list[str]] = [[] for _ in range(deepest + 1)]
    for phase in phases:
        if phase in depth:
            rows[depth[phase]].append(phase)
    return [row for row in (*rows, stray, ends) if row]


def ordered(rows: list[list[str]], moves: Sequence[Move], widths: Mapping[str, float],
            ) -> list[list[str]]:
    """Each row's order: the one whose straight lines between the phases' centres cross
    least and pass least through other phases' boxes (every order of a row of at most
    ``EXACT`` phases is tried, first against the rows above, then again against all the
    others; a longer row is sorted by its neighbours' mean place above)."""
    pairs = list({tuple(sorted((m.source, m.target))) for m in moves})
    out = [list(row) for row in rows]
    for sweep in range(3):
        for n, row in enumerate(out):
            if len(row) == 1:
                continue
            fixed = out[:n] if sweep == 0 else out[:n] + out[n + 1:]
            known = {p for r in fixed for p in r}
            if len(row) > EXACT:
                out[n] = _by_neighbours(row, pairs, out, widths)
                continue
            best = None
            for order in itertools.permutations(row):
                rows_now = out[:n] + [list(order)] + out[n + 1:]
                placed = known | set(order)
                cost = _tangle(rows_now, [p for p in pairs if placed.issuperset(p)], widths)
                if best is None or cost < best[0] - 1e-9:
                    best = (cost, list(order))
            assert best is not None
            out[n] = best[1]
    return out


EXACT = 6


def _centres(rows: list[list[str]], widths: Mapping[str, float]) -> dict[str, Box]:
    boxes: dict[str, Box] = {}
    for n, row in enumerate(rows):
        total = sum(widths[p] for p in row) + COLUMN_GAP * (len(row) - 1)
        x = -total / 2
        for phase in row:
            boxes[phase] = Box(x + widths[phase] / 2, n * ROW_STEP, widths[phase], 36)
            x += widths[phase] + COLUMN_GAP
    return boxes


def _tangle(rows: list[list[str]], pairs: Sequence[tuple[str, ...]],
            widths: Mapping[str, float]) -> float:
    """Crossings of the straight lines between the phases of ``pairs``, plus three for
    each line through another phase's box, plus their length (a tie-break)."""
    boxes = _centres(rows, widths)
    lines = [((boxes[a].x, boxes[a].y), (boxes[b].x, boxes[b].y), a, b) for a, b in pairs]
    cost = 0.0
    for i, (p, q, a, b) in enumerate(lines):
        cost += math.dist(p, q) / 5000
        for r, s, c, d in lines[i + 1:]:
            if not {a, b} & {c, d} and _crosses(p, q, r, s):
                cost += 1
        for phase, box in boxes.items():
            if phase not in (a, b) and _through(p, q, box.inflated(4)):
                cost += 3
    return cost


def _through(p: tuple[float, float], q: tuple[float, float], box: Box) -> bool:
    """Whether the segment p-q passes through ``box`` (sampled)."""
    return any(box.holds((p[0] + (q[0] - p[0]) * t / 16, p[1] + (q[1] - p[1]) * t / 16))
               for t in range(1, 16))


def _by_neighbours(row: list[str], pairs: Sequence[tuple[str, ...]],
                   rows: list[list[str]], widths: Mapping[str, float]) -> list[str]:
    boxes = _centres(rows, widths)
    rank = {p: n for n, r in enumerate(rows) for p in r}

    def key(phase: str) -> tuple[float, int]:
        xs = [boxes[b if a == phase else a].x for a, b in pairs if phase in (a, b)
              and rank[b if a == phase else a] < rank[phase]]
        return (sum(xs) / len(xs) if xs else boxes[phase].x, row.index(phase))
    return sorted(row, key=key)


# ---------------------------------------------------------------- geometry
def text_width(text: str, size: float) -> float:
    return len(text) * size * CHAR


def sizes_of(phases: Iterable[str], loops: Mapping[str, list[Move]],
             ) -> dict[str, tuple[float, float]]:
    """Each phase's box size: its name, then a line per owner of the moves that stay in it."""
    sizes = {}
    for phase in phases:
        lines = [text_width(phase, NAME_SIZE)] + [
            text_width(f"{LOOP} {m.label}", LOOP_SIZE) for m in loops.get(phase, ())]
        sizes[phase] = (max(lines) + 2 * PAD_X,
                        NAME_SIZE + 2 * PAD_Y + len(loops.get(phase, ())) * (LOOP_SIZE + 4))
    return sizes


def boxes_of(rows: list[list[str]], sizes: Mapping[str, tuple[float, float]],
             ) -> tuple[dict[str, Box], float]:
    """Each phase's box, the rows centred on the canvas; and the canvas width."""
    widths = [sum(sizes[p][0] for p in row) + COLUMN_GAP * (len(row) - 1) for row in rows]
    width = max(widths) + 2 * SIDE
    boxes = {}
    for n, (row, row_width) in enumerate(zip(rows, widths)):
        x = (width - row_width) / 2
        for phase in row:
            w, h = sizes[phase]
            boxes[phase] = Box(x + w / 2, TOP + n * ROW_STEP, w, h)
            x += w + COLUMN_GAP
    return boxes, width


def _crosses(p: tuple[float, float], q: tuple[float, float], r: tuple[float, float],
             s: tuple[float, float]) -> bool:
    def side(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
    return (side(p, q, r) * side(p, q, s) < 0) and (side(r, s, p) * side(r, s, q) < 0)


def _crossings(ours: Any, theirs: Any) -> int:
    """How many segments of polyline ``ours`` cross segments of ``theirs`` ([N, 2] arrays)."""
    p, q = ours[:-1, None, :], ours[1:, None, :]
    r, s = theirs[None, :-1, :], theirs[None, 1:, :]

    def side(a: Any, b: Any, c: Any) -> Any:
        return (b[..., 0] - a[..., 0]) * (c[..., 1] - a[..., 1]) - (
            b[..., 1] - a[..., 1]) * (c[..., 0] - a[..., 0])
    return int(((side(p, q, r) * side(p, q, s) < 0)
                & (side(r, s, p) * side(r, s, q) < 0)).sum())


def _inside(points: Any, boxes: Sequence[Box]) -> Any:
    """Per point ([N, 2]), whether it lies in any of ``boxes``."""
    import numpy as np

    if not boxes:
        return np.zeros(len(points), bool)
    centre = np.array([(b.x, b.y) for b in boxes])
    half = np.array([(b.w / 2, b.h / 2) for b in boxes])
    return (np.abs(points[:, None, :] - centre[None]) <= half[None]).all(axis=2).any(axis=1)


def route(move: Move, boxes: Mapping[str, Box], drawn: Sequence[Drawn],
          width: float, height: float, fixed: Sequence[Box] = ()) -> Drawn:
    """The arrow of ``move``: the bend and the label's place of least cost (module
    docstring); ``fixed``: more boxes to keep clear (the start mark)."""
    import numpy as np

    a, b = boxes[move.source], boxes[move.target]
    dx, dy = b.x - a.x, b.y - a.y
    length = math.hypot(dx, dy) or 1.0
    normal = (-dy / length, dx / length)
    others = [box.inflated(6) for p, box in boxes.items()
              if p not in (move.source, move.target)] + list(fixed)
    every_box = [box.inflated(3) for box in boxes.values()] + list(fixed)
    labels = [d.label for d in drawn]
    label_w = text_width(move.label, LABEL_SIZE) + 8
    theirs = [np.array(d.points[3:-3]) for d in drawn]
    everything = np.concatenate([np.array(d.points) for d in drawn]) if drawn else \
        np.zeros((0, 2))
    ts = np.linspace(0, 1, SAMPLES + 1)[:, None]
    best: tuple[float, Drawn] | None = None
    for bend in BENDS:
        mid = ((a.x + b.x) / 2 + normal[0] * bend, (a.y + b.y) / 2 + normal[1] * bend)
        start, end = a.edge_towards(mid), b.edge_towards(mid)
        control = (2 * mid[0] - (start[0] + end[0]) / 2, 2 * mid[1] - (start[1] + end[1]) / 2)
        points = ((1 - ts) ** 2 * np.array(start) + 2 * (1 - ts) * ts * np.array(control)
                  + ts ** 2 * np.array(end))
        inner = points[3:-3]
        cost = abs(bend) * 0.4 + 30 * (bend / 100) ** 2 + 1000 * int(_inside(inner, others).sum())
        cost += 1000 * int(((points < 4) | (points > np.array([width - 4, height - 4])))
                           .any(axis=1).sum())
        for other in theirs:
            near = np.linalg.norm(inner[:, None, :] - other[None], axis=2).min(axis=1) < 10
            cost += 12 * int(near.sum()) + 25 * _crossings(inner[::2], other[::2])
        cost += 30 * int(_inside(inner, [box.inflated(2) for box in labels]).sum())
        place_cost, label = math.inf, Box(0, 0, 0, 0)
        for t in PLACES:
            x, y = points[round(t * SAMPLES)]
            box = Box(float(x), float(y), label_w, LABEL_SIZE + 6)
            c = (2 * sum(box.overlap(o) for o in every_box)
                 + 2 * sum(box.overlap(o) for o in labels)
                 + 15 * int(_inside(everything, [box]).sum())
                 + abs(t - 0.5) * 20)
            if c < place_cost:
                place_cost, label = c, box
        cost += place_cost
        if best is None or cost < best[0]:
            best = (cost, Drawn(move, start, control, end,
                                [(float(x), float(y)) for x, y in points], label))
    assert best is not None
    return best[1]


def start_mark(box: Box) -> tuple[tuple[float, float], Box]:
    """Where the start dot goes (left of the start phase), and the box its dot, arrow and
    word take."""
    dot = (box.x - box.w / 2 - 56, box.y)
    return dot, Box(dot[0] + 22, dot[1] - 8, 64, 34)


def layout(phases: Sequence[str], moves: list[Move], loops: Mapping[str, list[Move]],
           start: str) -> tuple[dict[str, Box], list[Drawn], float, float]:
    """The phases' boxes, the arrows, and the size of the drawing above its legend."""
    sizes = sizes_of(phases, loops)
    rows = ordered(layers_of(phases, moves, start), moves, {p: s[0] for p, s in sizes.items()})
    boxes, width = boxes_of(rows, sizes)
    height = TOP + (len(rows) - 1) * ROW_STEP + 60
    rank = {p: n for n, row in enumerate(rows) for p in row}
    # near moves first (they keep straight lines), then those across rows, longest last
    todo = sorted(moves, key=lambda m: (abs(rank[m.source] - rank[m.target]),
                                        math.dist((boxes[m.source].x, boxes[m.source].y),
                                                  (boxes[m.target].x, boxes[m.target].y))))
    mark = start_mark(boxes[start if start in boxes else phases[0]])[1]
    drawn: list[Drawn] = []
    for move in todo:
        drawn.append(route(move, boxes, drawn, width, height, [mark]))
    return boxes, drawn, width, height


# ---------------------------------------------------------------- SVG
def _text(x: float, y: float, text: str, size: float, colour: str, anchor: str = "middle",
          weight: str = "normal", attrs: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{colour}" '
            f'text-anchor="{anchor}" font-weight="{weight}"{attrs}>{escape(text)}</text>')


def _wrapped(text: str, chars: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > chars:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return [*lines, line] if line else lines


def draw(phases: Mapping[str, str], transitions: Mapping[str, Mapping[str, str]],
         operator: Iterable[str], start: str = START) -> str:
    """The SVG of a migration's phases (boxes) and the moves between them (arrows labelled
    with their actions): the operator's in one colour, the applier's in another."""
    operator = tuple(operator)
    names = list(phases)
    moves, loops = moves_of(phases, transitions, operator)
    boxes, drawn, width, height = layout(names, moves, loops, start)
    used = [a for acts in transitions.values() for a in acts]
    theirs = list(dict.fromkeys(a for a in used if a not in operator))
    ours = [a for a in operator if a in used]
    either: dict[tuple[str, str], list[str]] = {}
    for m in moves:
        if m.either:
            for action in m.actions:
                either.setdefault((m.source, action), []).append(m.target)
    legend: list[tuple[str | None, str, str]] = [
        (OPERATOR_COLOUR, "solid", "the operator's action (API, CLI, web page): "
         + ", ".join(ours)),
        (APPLIER_COLOUR, "solid", "the applier's (the gateway, on what the backfill, its "
         "gate and its job do): " + ", ".join(theirs))]
    if either:
        legend.append((INK, "dashed", "one phase or the other, decided when it happens: "
                       + "; ".join(f"{action} from {source} leads to {' or '.join(targets)}"
                                   for (source, action), targets in either.items())))
    if loops:
        legend.append((None, LOOP, "inside a phase: actions that leave it in that phase"))
    if any(not transitions.get(p) for p in names):
        legend.append((None, "double", "a phase no action leaves: the migration is closed"))
    chars = int((width - 110) / (LABEL_SIZE * CHAR))
    legend_lines = [(c, s, _wrapped(t, chars)) for c, s, t in legend]
    legend_top = height + 10
    total = legend_top + sum(len(lines) * (LABEL_SIZE + 5) + 6 for *_, lines in legend_lines) + 16
    out = [
        (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{total:.0f}" '
         f'viewBox="0 0 {width:.0f} {total:.0f}" font-family={quoteattr(FONT)} role="img">'),
        ("<!-- generated by docs/hooks/phase_diagram.py from "
         "service/jobkinds/migrate/lifecycle.py at build time: edit the table, not this -->"),
        "<title>A migration's phases and the actions that move it between them</title>",
        "<defs>",
    ]
    for name, colour in (("operator", OPERATOR_COLOUR), ("applier", APPLIER_COLOUR),
                         ("start", INK)):
        out.append(f'<marker id="arrow-{name}" viewBox="0 0 10 10" refX="9" refY="5" '
                   f'markerWidth="8" markerHeight="8" orient="auto-start-reverse">'
                   f'<path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>')
    out += ["</defs>", '<rect width="100%" height="100%" fill="#ffffff"/>']
    # where every migration starts
    first = boxes[start] if start in boxes else boxes[names[0]]
    dot = start_mark(first)[0]
    out.append(f'<circle cx="{dot[0]:.1f}" cy="{dot[1]:.1f}" r="6" fill="{INK}"/>')
    out.append(f'<path d="M{dot[0] + 7:.1f},{dot[1]:.1f} L{first.x - first.w / 2 - 2:.1f},'
               f'{dot[1]:.1f}" stroke="{INK}" stroke-width="1.4" fill="none" '
               f'marker-end="url(#arrow-start)"/>')
    out.append(_text(dot[0], dot[1] - 12, "start", LABEL_SIZE, INK))
    for d in drawn:
        m = d.move
        owner = "operator" if m.operator else "applier"
        colour = OPERATOR_COLOUR if m.operator else APPLIER_COLOUR
        dash = ' stroke-dasharray="6 4"' if m.either else ""
        out.append(
            f'<g class="move" data-from={quoteattr(m.source)} data-to={quoteattr(m.target)} '
            f'data-actions={quoteattr(",".join(m.actions))} data-owner="{owner}">'
            f"<title>{escape(m.source)} \u2192 {escape(m.target)}: {escape(m.label)} "
            f"(the {owner}'s)</title>"
            f'<path d="M{d.start[0]:.1f},{d.start[1]:.1f} Q{d.control[0]:.1f},'
            f'{d.control[1]:.1f} {d.end[0]:.1f},{d.end[1]:.1f}" fill="none" '
            f'stroke="{colour}" stroke-width="1.6"{dash} marker-end="url(#arrow-{owner})"/>'
            "</g>")
    for d in drawn:  # labels over every arrow
        colour = OPERATOR_COLOUR if d.move.operator else APPLIER_COLOUR
        box = d.label
        out.append(f'<rect x="{box.x - box.w / 2:.1f}" y="{box.y - box.h / 2:.1f}" '
                   f'width="{box.w:.1f}" height="{box.h:.1f}" rx="3" fill="#ffffff" '
                   f'fill-opacity="0.9"/>')
        out.append(_text(box.x, box.y + LABEL_SIZE * 0.36, d.move.label, LABEL_SIZE, colour,
                         attrs=' class="label"'))
    for phase, box in boxes.items():
        closed = not transitions.get(phase)
        out.append(f'<g class="phase" data-phase={quoteattr(phase)}>'
                   f"<title>{escape(phase)}: {escape(phases[phase])}</title>")
        left, top = box.x - box.w / 2, box.y - box.h / 2
        out.append(f'<rect x="{left:.1f}" y="{top:.1f}" width="{box.w:.1f}" '
                   f'height="{box.h:.1f}" rx="8" fill="{NODE_FILL}" stroke="{INK}" '
                   f'stroke-width="1.4"/>')
        if closed:
            out.append(f'<rect x="{left + 3.5:.1f}" y="{top + 3.5:.1f}" width="{box.w - 7:.1f}" '
                       f'height="{box.h - 7:.1f}" rx="6" fill="none" stroke="{INK}" '
                       f'stroke-width="1"/>')
        y = top + PAD_Y + NAME_SIZE * 0.85
        out.append(_text(box.x, y, phase, NAME_SIZE, INK, weight="bold"))
        for m in loops.get(phase, ()):
            y += LOOP_SIZE + 4
            owner = "operator" if m.operator else "applier"
            out.append(_text(box.x, y, f"{LOOP} {m.label}", LOOP_SIZE,
                             OPERATOR_COLOUR if m.operator else APPLIER_COLOUR,
                             attrs=f' class="loop" data-phase={quoteattr(phase)} '
                                   f'data-actions={quoteattr(",".join(m.actions))} '
                                   f'data-owner="{owner}"'))
        out.append("</g>")
    # the legend
    y = legend_top
    out.append(f'<line x1="20" y1="{y - 6:.1f}" x2="{width - 20:.1f}" y2="{y - 6:.1f}" '
               f'stroke="#d1d5db"/>')
    for colour, style, lines in legend_lines:
        y += LABEL_SIZE + 5
        if style in ("solid", "dashed"):
            dash = ' stroke-dasharray="6 4"' if style == "dashed" else ""
            out.append(f'<line x1="24" y1="{y - 4:.1f}" x2="76" y2="{y - 4:.1f}" '
                       f'stroke="{colour}" stroke-width="1.6"{dash}/>')
        elif style == "double":
            out.append(f'<rect x="36" y="{y - 13:.1f}" width="28" height="17" rx="4" '
                       f'fill="{NODE_FILL}" stroke="{INK}" stroke-width="1.2"/>'
                       f'<rect x="39" y="{y - 10:.1f}" width="22" height="11" rx="3" '
                       f'fill="none" stroke="{INK}" stroke-width="0.9"/>')
        else:
            out.append(_text(50, y, style, LABEL_SIZE + 2, INK))
        for n, line in enumerate(lines):
            out.append(_text(90, y, line, LABEL_SIZE, colour or INK, anchor="start"))
            if n < len(lines) - 1:
                y += LABEL_SIZE + 5
        y += 6
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render() -> str:
    """The diagram of the table as the code has it now."""
    from service.jobkinds.migrate import lifecycle

    return draw(lifecycle.PHASES, lifecycle.TRANSITIONS, lifecycle.OPERATOR)


# ---------------------------------------------------------------- MkDocs hook
def on_files(files: Any, config: Any) -> Any:
    """Add the diagram to the build (it exists in no source file)."""
    from mkdocs.structure.files import File

    existing = files.get_file_from_path(OUT)
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, OUT, content=render()))
    return files
