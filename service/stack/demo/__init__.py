"""``nobackfill demo``: the whole story of DESIGN.md, non-interactively, on the synthetic
world (``story``), with a table per step and ``report.md`` with plots (``report``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction, name: str) -> None:
    from service.stack.demo.world import PROFILES

    p = sub.add_parser(name, help="run the whole story on the synthetic world: v1 and its "
                                  "gallery, a new domain, a new language, an XBT upgrade, "
                                  "the gate, promotion, every version against the gallery, a "
                                  "managed migration into v2's space and its rollback")
    p.add_argument("--out", default="runs/demo", help="an empty or new directory: data, "
                                                      "logs, report.md and plots")
    p.add_argument("--profile", choices=sorted(PROFILES), default="full",
                   help="full: the real story (26 min measured on 2 CPU cores); quick: a toy "
                        "size that checks the wiring in a minute")
    p.add_argument("--device", help="cpu, cuda (default: cuda when present)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import itertools

    from service.stack.demo.report import end_text, step_text, write_report
    from service.stack.demo.story import STEPS, Step, run_story
    from service.stack.demo.world import PROFILES

    numbers = itertools.count(1)

    def show(step: Step) -> None:
        print(step_text(step, next(numbers), STEPS) + "\n", flush=True)

    story = run_story(Path(args.out), PROFILES[args.profile], args.device, show)
    write_report(story)
    print(end_text(story), flush=True)
    return 0
