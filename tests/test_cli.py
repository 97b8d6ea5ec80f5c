"""The nobackfill CLI: help everywhere, and synth -> train-base -> eval -> info end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training.cli import build_parser, main

COMMANDS = [["synth"], ["train-base"], ["eval"], ["info"], ["bench"], ["bench", "base"]]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_on_every_command(command: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*command, "--help"])
    assert exc.value.code == 0
    assert "usage: nobackfill" in capsys.readouterr().out


def test_console_script_is_installed() -> None:
    exe = shutil.which("nobackfill") or str(Path(sys.executable).parent / "nobackfill")
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    assert "train-base" in out and "bench" in out


def test_synth_train_eval_info(tmp_path: Path, micro_config_file: Path,
                               capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "data"
    assert main(["synth", "--out", str(data), "--n", "40", "--languages", "en,de",
                 "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["manifest"] == str(data / "manifest.jsonl")
    assert (data / "manifest.jsonl").is_file()
    art = tmp_path / "v1"
    assert main(["train-base", "--data", str(data), "--model-config", str(micro_config_file),
                 "--out", str(art), "--steps", "3", "--batch-size", "8", "--version-id", "v1",
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["eval", str(art), "--data", str(data), "--json"]) == 0
    matrix = json.loads(capsys.readouterr().out)
    assert matrix["models"] == ["v1"]
    assert 0 <= matrix["cells"]["v1"]["v1"]["t2i"]["R@1"] <= 1
    assert main(["info", str(art)]) == 0
    assert json.loads(capsys.readouterr().out)["version_id"] == "v1"


def test_errors_are_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["info", str(tmp_path)]) == 2
    assert "manifest.json is missing" in capsys.readouterr().err
    assert main(["synth", "--out", str(tmp_path / "d"), "--n", "5", "--domains", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
