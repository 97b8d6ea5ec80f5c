"""The diagram of a migration's phases (``docs/hooks/phase_diagram.py``) is drawn from the
lifecycle table at build time: every phase and every move of the table is in the picture,
nothing else is, and a table with one phase or one move more gives another picture."""

from __future__ import annotations

import copy
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs" / "hooks"))

import phase_diagram as diagram

from service.jobkinds.migrate import lifecycle

SVG = "{http://www.w3.org/2000/svg}"


def table() -> tuple[dict[str, str], dict[str, dict[str, str]], tuple[str, ...]]:
    return (dict(lifecycle.PHASES), copy.deepcopy(lifecycle.TRANSITIONS),
            tuple(lifecycle.OPERATOR))


def expected_moves(transitions: dict[str, dict[str, str]],
                   operator: tuple[str, ...]) -> set[tuple[str, str, str, str]]:
    """(from, action, to, whose) of every move, a target ``a|b`` being a move to each."""
    return {(source, action, target, "operator" if action in operator else "applier")
            for source, actions in transitions.items() for action, spec in actions.items()
            for target in spec.split("|")}


def drawn(svg: str) -> tuple[list[str], set[tuple[str, str, str, str]], str]:
    """The phases boxed in ``svg``, the moves drawn (arrows and the moves listed inside a
    phase), and all its visible text."""
    root = ET.fromstring(svg)
    phases = [g.get("data-phase") for g in root.iter(f"{SVG}g") if g.get("class") == "phase"]
    moves = set()
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "move":
            moves |= {(g.get("data-from"), a, g.get("data-to"), g.get("data-owner"))
                      for a in g.get("data-actions").split(",")}
    for t in root.iter(f"{SVG}text"):
        if t.get("class") == "loop":
            phase = t.get("data-phase")
            moves |= {(phase, a, phase, t.get("data-owner"))
                      for a in t.get("data-actions").split(",")}
    text = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    return phases, moves, text


def test_every_phase_and_every_move_of_the_table_is_drawn() -> None:
    phases, transitions, operator = table()
    svg = diagram.draw(phases, transitions, operator)
    boxed, moves, text = drawn(svg)
    assert sorted(boxed) == sorted(phases)
    assert moves == expected_moves(transitions, operator)
    words = set(text.replace(",", " ").split())
    assert set(phases) <= words  # each phase's name is written in its box
    assert {a for acts in transitions.values() for a in acts} <= words  # each action too
    assert "http" not in svg.replace("http://www.w3.org/2000/svg", "")  # nothing fetched
    assert "<script" not in svg


def test_operator_and_applier_moves_have_their_own_colours() -> None:
    svg = diagram.draw(*table())
    root = ET.fromstring(svg)
    colours = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "move":
            path = g.find(f"{SVG}path")
            colours.setdefault(g.get("data-owner"), set()).add(path.get("stroke"))
    assert colours == {"operator": {diagram.OPERATOR_COLOUR},
                       "applier": {diagram.APPLIER_COLOUR}}


def test_a_new_phase_or_move_changes_the_picture() -> None:
    phases, transitions, operator = table()
    before = diagram.draw(phases, transitions, operator)
    assert diagram.draw(*table()) == before  # the same table, the same picture

    more_phases, more_moves = dict(phases), copy.deepcopy(transitions)
    more_phases["archived"] = "closed, its sides kept cold"
    more_moves["archived"] = {"restore": "switched|rolled_back"}
    more_moves["ended"] = {**more_moves.get("ended", {}), "archive": "archived"}
    after = diagram.draw(more_phases, more_moves, (*operator, "archive"))
    assert after != before
    boxed, moves, _ = drawn(after)
    assert "archived" in boxed
    assert moves == expected_moves(more_moves, (*operator, "archive"))

    one_more = copy.deepcopy(transitions)
    one_more["switched"]["audit"] = "switched"  # a move that stays, the applier's
    assert diagram.draw(phases, one_more, operator) != before
    assert ("switched", "audit", "switched", "applier") in drawn(
        diagram.draw(phases, one_more, operator))[1]


def test_a_move_to_no_phase_fails_the_build() -> None:
    phases, transitions, operator = table()
    transitions["switched"]["vanish"] = "nowhere"
    try:
        diagram.draw(phases, transitions, operator)
    except ValueError as exc:
        assert "nowhere" in str(exc)
    else:
        raise AssertionError("a move to a phase the table lacks was drawn")


def test_labels_and_boxes_do_not_overlap() -> None:
    """The layout's own promise, on the real table: no label over a phase's box, no two
    labels over each other (beyond a sliver)."""
    phases, transitions, operator = table()
    moves, loops = diagram.moves_of(phases, transitions, operator)
    boxes, arrows, width, _ = diagram.layout(list(phases), moves, loops, diagram.START)
    labels = [a.label for a in arrows]
    for n, label in enumerate(labels):
        assert all(label.overlap(box) < 20 for box in boxes.values()), arrows[n].move
        assert all(label.overlap(other) < 20 for other in labels[n + 1:]), arrows[n].move
        assert 0 <= label.x - label.w / 2 and label.x + label.w / 2 <= width
    assert len({(round(b.x), round(b.y)) for b in boxes.values()}) == len(boxes)
