"""``nobackfill store``: the embedded gallery store, offline (stop the gateway first: an
embedded store is open in one process at a time).

    nobackfill store move --data-dir data    # local mode (data/qdrant) -> Qdrant Edge
                                             # (data/qdrant-edge), checked

``move`` copies every collection, point and alias, checks counts and a digest of every
point per collection, and leaves the local-mode directory as it was. Its target opens only
once the move has finished (a marker written last); an interrupted move is redone by
running the same command again."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from service.state.errors import Conflict


def cmd_move(args: argparse.Namespace) -> int:
    from service.state.gallery.move import move_local_to_edge

    data = Path(args.data_dir)
    source = Path(args.source) if args.source else data / "qdrant"
    target = Path(args.target) if args.target else data / "qdrant-edge"
    try:
        moved = move_local_to_edge(source, target, progress=lambda line: print(
            f"[move] {line}", file=sys.stderr, flush=True))
    except Conflict as exc:
        print(f"error: {exc}")
        return 1
    if args.json:
        print(json.dumps(moved.__dict__, indent=1))
        return 0
    for name, points in moved.collections.items():
        print(f"{name:30s} {points:>9,} points  sha256 {moved.digests[name][:16]}  equal")
    for alias, collection in moved.aliases.items():
        print(f"alias {alias} -> {collection}")
    print(f"moved {source} -> {target} in {moved.seconds:.1f} s; the gateway opens it with "
          f"the default NOBACKFILL_QDRANT_ENGINE=edge. {source} is unchanged: delete it "
          f"once satisfied.")
    return 0


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="the embedded gallery store, offline: move local-mode data "
                                  "to Qdrant Edge", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    move = actions.add_parser("move", help="copy a local-mode directory into a new Qdrant "
                              "Edge store and check counts and vectors")
    move.add_argument("--data-dir", default="data", help="the service's NOBACKFILL_DATA_DIR")
    move.add_argument("--from", dest="source", help="local-mode directory (default "
                      "DATA_DIR/qdrant)")
    move.add_argument("--to", dest="target", help="new Edge directory (default "
                      "DATA_DIR/qdrant-edge)")
    move.add_argument("--json", action="store_true")
    move.set_defaults(func=cmd_move)
