"""``Roots.read``: the bytes of a file under an allowed root, with a memo of resolved
directories over a batch of paths (a reranked search's candidates), against ``Roots.file``
followed by a read: the same bytes or the same refusal for every kind of path, links that
leave the roots included, memo or not."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from service.state.errors import InvalidInput
from service.state.paths import Roots


@pytest.fixture
def world(tmp_path: Path) -> tuple[Roots, Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "images" / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "images" / "a.png").write_bytes(b"a-bytes")
    (root / "images" / "b.png").write_bytes(b"b-bytes")
    (root / "images" / "sub" / "c.png").write_bytes(b"c-bytes")
    (outside / "secret").write_bytes(b"secret")
    (root / "images" / "inner-link.png").symlink_to(root / "images" / "b.png")
    (root / "images" / "outer-link.png").symlink_to(outside / "secret")
    (root / "dir-link").symlink_to(outside)
    (root / "dangling.png").symlink_to(root / "nowhere.png")
    os.mkfifo(root / "images" / "fifo.png")
    return Roots((root.resolve(),)), root, outside


def _outcome(call):
    try:
        return ("bytes", call())
    except InvalidInput as exc:
        return ("refused", str(exc))


def test_read_gives_what_file_then_read_gives_for_every_kind_of_path(world) -> None:
    roots, root, outside = world
    paths = [f"{root}/images/a.png", f"{root}/images/b.png", f"{root}/images/sub/c.png",
             f"{root}/images/inner-link.png", f"{root}/images/outer-link.png",
             f"{root}/dir-link/secret", f"{root}/images/../../outside/secret",
             f"{root}/images/sub/..", f"{root}/images", f"{root}/images/missing.png",
             f"{root}/dangling.png", f"{root}/images/fifo.png", f"{outside}/secret",
             f"{root}/images/a.png\0x", f"{root}/images/a.png/x", ""]
    memo: dict[str, str] = {}
    for path in paths * 2:  # the second pass finds every directory in the memo
        expected = _outcome(lambda p=path: roots.file(p, "image source").read_bytes())
        assert _outcome(lambda p=path: roots.read(p, "image source")) == expected, path
        assert _outcome(lambda p=path: roots.read(p, "image source", memo)) == expected, path
    assert roots.read(f"{root}/images/inner-link.png", "x", memo) == b"b-bytes"
    assert "outside the allowed roots" in _outcome(
        lambda: roots.read(f"{root}/images/outer-link.png", "x", memo))[1]
    assert "outside the allowed roots" in _outcome(
        lambda: roots.read(f"{root}/dir-link/secret", "x", memo))[1]
    assert "not a usable path" in _outcome(lambda: roots.read(f"{root}/a\0", "x", memo))[1]
    # one entry per directory named, resolved once
    assert memo[f"{root}/images"] == str((root / "images").resolve())
    assert len(memo) == len({os.path.split(p)[0] for p in paths
                             if os.path.split(p)[1] not in ("", ".", "..")
                             and "\0" not in os.path.split(p)[0]})


def test_read_refuses_a_fifo_without_waiting_for_a_writer(world) -> None:
    roots, root, _ = world
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(_outcome(
        lambda: roots.read(f"{root}/images/fifo.png", "image source", {}))), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "read blocked on a FIFO"
    assert len(got) == 1 and got[0][0] == "refused" and "no file at" in got[0][1]


def test_a_link_made_after_its_directory_was_memoised_is_followed(world) -> None:
    """The memo keeps directories only: a file replaced by a link to outside the roots
    between two reads of one batch is refused on the second."""
    roots, root, outside = world
    memo: dict[str, str] = {}
    target = root / "images" / "sub" / "c.png"
    assert roots.read(str(target), "x", memo) == b"c-bytes"
    target.unlink()
    target.symlink_to(outside / "secret")
    assert "outside the allowed roots" in _outcome(lambda: roots.read(str(target), "x",
                                                                       memo))[1]
