"""One contract for the settings and registries of every method, continual or upgrade:
strict ``from_dict`` (lenient only for recorded configs), parsing of ``--set`` strings,
``describe`` for ``--help``, registries by name, and no import cycles in ``training``."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from training.config import MethodConfig, describe, setting
from training.continual import get_strategy
from training.continual.strategy import StrategyConfig
from training.errors import ConfigError
from training.method_registry import MethodRegistry
from training.upgrades.registry import UPGRADES, UpgradeMethod, get_upgrade, register_upgrade
from training.upgrades.xbt.config import AdapterConfig, XbtConfig


@dataclass
class Demo(MethodConfig):
    rate: float = setting(0.5, "how fast")
    rounds: int = setting(3, "how often")
    loud: bool = setting(False, "say it")
    names: tuple[str, ...] = setting(("a", "b"), "who")
    label: str = setting("x", "what")

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")


@dataclass
class LouderDemo(Demo):
    loud: bool = True  # a new default, no help text of its own


# ---------------------------------------------------------------- from_dict / to_dict
def test_strings_are_parsed_by_field_type() -> None:
    cfg = Demo.from_dict({"rate": "1e-3", "rounds": "7", "loud": "yes", "names": "c, d,,e",
                          "label": "007"})
    assert cfg == Demo(rate=1e-3, rounds=7, loud=True, names=("c", "d", "e"), label="007")
    assert Demo.from_dict({"names": ["c"], "loud": False}).names == ("c",)  # JSON values


@pytest.mark.parametrize("values, message", [
    ({"rounds": "2.5"}, "rounds expects an integer, got '2.5'"),
    ({"loud": "maybe"}, "loud expects true or false"),
    ({"rate": "fast"}, "rate expects a number"),
    ({"rounds": "0"}, "rounds must be >= 1"),  # the subclass's own validation
])
def test_bad_values_name_the_field(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Demo.from_dict(values)


@pytest.mark.parametrize("config", [Demo, XbtConfig, AdapterConfig, StrategyConfig,
                                    get_strategy("modx").Config])
def test_from_dict_is_strict_and_names_the_unknown_keys(config: type[MethodConfig]) -> None:
    with pytest.raises(ConfigError) as exc:
        config.from_dict({"bogus": 1, "zzz": 2})
    message = str(exc.value)
    assert f"{config.__name__} has no field(s) ['bogus', 'zzz']" in message
    assert "its fields: " in message


def test_a_near_miss_gets_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"did you mean: rouds -> rounds\?"):
        Demo.from_dict({"rouds": 2})


@pytest.mark.parametrize("config, manifest_value", [
    (XbtConfig, XbtConfig(steps=3, anchor=True)),
    (AdapterConfig, AdapterConfig(lora_r=4, prompts=0)),
    (get_strategy("dns").Config, get_strategy("dns").Config(one_sided=("image",))),
])
def test_lenient_mode_reads_a_recorded_config_with_extra_keys(config: type[MethodConfig],
                                                              manifest_value: MethodConfig,
                                                              ) -> None:
    recorded = {**manifest_value.to_dict(), "added_by_a_newer_version": [1, 2]}
    assert config.from_dict(recorded, lenient=True) == manifest_value
    with pytest.raises(ConfigError, match="added_by_a_newer_version"):
        config.from_dict(recorded)


def test_recorded_keys_round_trip_strictly() -> None:
    cfg = XbtConfig(pair_anchor=True, lora_targets=".*attn")
    recorded = cfg.to_dict()
    assert "package_version" in recorded and recorded["pair_anchor"] is True
    assert XbtConfig.from_dict(recorded) == cfg
    assert Demo().to_dict()["names"] == ["a", "b"]  # JSON-ready


# ---------------------------------------------------------------- describe (--help)
def test_describe_lists_every_field_with_default_and_help() -> None:
    text = describe(Demo, skip=("label",))
    assert text.splitlines()[:2] == ["  rate = 0.5", "      how fast"]
    assert "  loud = false\n      say it" in text and "  names = a,b\n      who" in text
    assert "label" not in text
    assert "  loud = true\n      say it" in describe(LouderDemo)  # help inherited


# ---------------------------------------------------------------- registries
def test_registry_names_what_it_knows() -> None:
    things: MethodRegistry[type] = MethodRegistry("demo method")
    things.register("a")(type("A", (), {}))
    assert things.lookup("a").name == "a"
    with pytest.raises(ConfigError, match="unknown demo method 'b'; known methods: a"):
        things.lookup("b")
    with pytest.raises(ConfigError, match="demo method 'a' is registered twice"):
        things.register("a")(type("B", (), {}))


def test_get_upgrade_lists_the_known_names() -> None:
    assert get_upgrade("xbt").name == "xbt" and get_upgrade("direct").name == "direct"
    with pytest.raises(ConfigError, match="unknown upgrade method 'nope'; known methods: "
                                          "direct, xbt"):
        get_upgrade("nope")
    with pytest.raises(ConfigError, match=r"method must be one of \('xbt', 'direct'\)"):
        XbtConfig(method="nope")


def test_configure_takes_settings_and_fixes_the_method() -> None:
    cfg = get_upgrade("xbt").configure({"anchor": "true", "pretrain_steps": "4"})
    assert isinstance(cfg, XbtConfig) and (cfg.method, cfg.anchor, cfg.pretrain_steps) == (
        "xbt", True, 4)
    assert get_upgrade("direct").configure({}).method == "direct"
    with pytest.raises(ConfigError, match="'method' is not a setting"):
        get_upgrade("xbt").configure({"method": "direct"})
    with pytest.raises(ConfigError, match="anchor and pair_anchor apply to method 'xbt'"):
        get_upgrade("direct").configure({"anchor": "true"})


@pytest.fixture
def echo_method():
    """A third upgrade method, registered for one test and removed after it."""
    @register_upgrade("echo")
    class Echo(UpgradeMethod):
        summary = "returns what it is given"
        Config = XbtConfig

        def train(self, p, show_progress=True, on_progress=None):
            return "phi", {"echo": {"steps": self.config.steps}}
    yield Echo
    del UPGRADES["echo"]


def test_a_registered_method_runs_without_touching_the_upgrade_code(echo_method) -> None:
    from training.upgrades.run import train_upgrade

    cfg = XbtConfig(method="echo", steps=2)
    pairs = SimpleNamespace(pixels=[0] * 3, tokens=[0] * 5)
    phi, metrics = train_upgrade(SimpleNamespace(pairs=pairs), cfg, show_progress=False)
    assert phi == "phi"
    assert metrics == {"pair_images": 3, "pair_captions": 5, "echo": {"steps": 2}}


# ---------------------------------------------------------------- the import graph
def test_training_has_no_import_cycles() -> None:
    from tests.test_layout import cycles, edges

    graph = {m: {t for t in ts if t.startswith("training")}
             for m, ts in edges().items() if m.startswith("training")}
    assert cycles(graph) == []


def test_method_names_and_settings_load_without_torch() -> None:
    """The CLI builds ``upgrade NAME`` subcommands and their --help from these."""
    code = ("import sys, training.upgrades, training.upgrades.xbt.config, training.config; "
            "print(sorted(training.upgrades.UPGRADES), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["['direct',", "'xbt']", "False"]
