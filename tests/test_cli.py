"""The nobackfill CLI: help everywhere, and synth -> train-base -> eval -> info end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training.cli import build_parser, main

COMMANDS = [["synth"], ["train-base"], ["eval"], ["info"], ["bench"], ["bench", "base"],
            ["upgrade"], ["upgrade", "xbt"], ["upgrade", "direct"], ["continual"]]
UPGRADE = ["--old", "old", "--new", "new", "--corpus", "synth:10", "--pairs", "pairs",
           "--out", "out"]


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


@pytest.mark.parametrize("method", ["xbt", "direct"])
def test_upgrade_help_lists_the_method_settings(method: str,
                                                capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["upgrade", method, "--help"])
    out = capsys.readouterr().out
    assert "settings (--set KEY=VALUE), with their defaults:" in out
    assert "  pretrain_steps = 1000\n      stage 1 optimizer steps" in out
    assert "  anchor = false" in out and "  method =" not in out  # the subcommand is the method
    assert "--no-prompts" not in out and "--pretrain-steps" not in out


def test_upgrade_settings_are_parsed_by_the_method_config() -> None:
    from training.upgrades import get_upgrade

    args = build_parser().parse_args(["upgrade", "xbt", *UPGRADE, "--set", "anchor=true",
                                      "--set", "pretrain-steps=5", "--set", "lr=3e-4"])
    cfg = get_upgrade(args.upgrade).configure(dict(args.settings))
    assert (cfg.method, cfg.anchor, cfg.pretrain_steps, cfg.lr) == ("xbt", True, 5, 3e-4)
    args = build_parser().parse_args(["upgrade", "direct", *UPGRADE, "--set", "steps=3"])
    cfg = get_upgrade(args.upgrade).configure(dict(args.settings))
    assert (cfg.method, cfg.steps) == ("direct", 3)


@pytest.mark.parametrize("setting, message", [
    ("bogus=1", "has no field(s) ['bogus']"),
    ("steps=many", "steps expects an integer, got 'many'"),
    ("anchor=maybe", "anchor expects true or false, got 'maybe'"),
    ("method=direct", "'method' is not a setting"),
])
def test_bad_upgrade_settings_fail_with_exit_code_2(setting: str, message: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    """Checked before any artifact is opened (``--old`` here does not exist)."""
    assert main(["upgrade", "xbt", *UPGRADE, "--set", setting]) == 2
    err = capsys.readouterr().err
    assert message in err and "manifest" not in err


def test_a_setting_without_a_value_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["upgrade", "xbt", *UPGRADE, "--set", "anchor"])
    assert exc.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
