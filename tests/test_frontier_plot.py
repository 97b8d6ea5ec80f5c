"""``bench frontier``'s plot tells every line apart: each has its own colour and its own
marker (for up to 12 lines both differ; past that the pairs stay distinct), and the
legend sits below the panels."""

from __future__ import annotations

from pathlib import Path

from training.bench.frontier import COLOURS, MARKERS, line_styles, plot


def rows(names: list[str]) -> dict[str, list[dict]]:
    def point(f: float, share: float) -> dict:
        return {"fraction": f, "compute": f, "t2i": {"share": share, "se": 0.02},
                "i2t": {"share": share / 2, "se": None}}
    return {name: [point(f, n / 10 + f) for f in (0.0, 0.018, 0.05, 0.5, 1.0)]
            for n, name in enumerate(names)}


def test_every_line_of_the_plot_has_its_own_colour_and_marker(tmp_path: Path) -> None:
    names = ["today", "transform+id", "transform+random", "transform+learned", "progressive",
             "hybrid+learned", "hybrid+random", "rerank@5", "rerank@10", "rerank@20",
             "rerank@50", "fused@20", "rerank@100", "fused@50"]
    drawn = plot(rows(names), tmp_path / "frontier.png", "a test")
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
    assert list(drawn) == names
    pairs = list(drawn.values())
    assert len(set(pairs)) == len(pairs)  # 14 lines, 14 (colour, marker) pairs
    first = pairs[:12]  # the 12 lines the benchmark draws: both differ
    assert len({c for c, _ in first}) == 12 and len({m for _, m in first}) == 12
    assert drawn == {n: (c.lower(), m) for n, (c, m) in line_styles(names).items()}


def test_styles_stay_distinct_well_past_twelve_lines() -> None:
    many = [f"way {n}" for n in range(len(COLOURS) * len(MARKERS))]
    assert len(set(line_styles(many).values())) == len(many)
