"""Adapter routes: the fitted maps (Procrustes, affine, residual MLP), SLERP, and routes
that round-trip through artifacts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from training.artifacts import load_artifact
from training.data import PairDataset
from training.errors import ConfigError
from training.upgrades.adapter import MAPS, AdapterFitConfig, slerp
from training.upgrades.adapter.fit import Sample, fit_adapter, sample_from_dataset
from training.upgrades.adapter.maps import procrustes, ridge_affine
from training.versions import load_encoder


def _unit(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator()
                                                     .manual_seed(seed)), dim=-1)


def test_procrustes_is_orthogonal_and_recovers_a_known_rotation() -> None:
    x = _unit(400, 24, 0)
    rotation, _ = torch.linalg.qr(torch.randn(24, 24, generator=torch.Generator().manual_seed(1)))
    w = procrustes(x, x @ rotation)
    assert torch.allclose(w.T @ w, torch.eye(24), atol=1e-5)
    assert torch.allclose(w, rotation, atol=1e-5)


def test_procrustes_on_too_few_pairs_leaves_what_they_do_not_span_in_place() -> None:
    """5 pairs in 32-d fix the map on 5 directions only: the rest is left as it was (the
    tie-break towards the identity), so a query outside the pairs' span is not moved."""
    x = _unit(5, 32, 7)
    rotation, _ = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(8)))
    assert torch.allclose(procrustes(x, x), torch.eye(32), atol=1e-5)  # same space: identity
    w = procrustes(x, x @ rotation)
    assert torch.allclose(x @ w, x @ rotation, atol=1e-4)  # the pairs still fit exactly
    assert torch.allclose(w.T @ w, torch.eye(32), atol=1e-5)


def test_procrustes_between_different_widths_is_semi_orthogonal() -> None:
    w = procrustes(_unit(300, 32, 2), _unit(300, 16, 3))  # [32, 16]
    assert w.shape == (32, 16)
    assert torch.allclose(w.T @ w, torch.eye(16), atol=1e-5)


def test_affine_recovers_a_known_affine_map() -> None:
    x = _unit(500, 16, 4)
    a = torch.randn(16, 8, generator=torch.Generator().manual_seed(5))
    b = torch.randn(8, generator=torch.Generator().manual_seed(6))
    w, bias = ridge_affine(x, x @ a + b, ridge=0.0)
    assert torch.allclose(w, a, atol=1e-4) and torch.allclose(bias, b, atol=1e-4)


def test_low_rank_affine_has_the_asked_rank() -> None:
    x, y = _unit(300, 16, 7), _unit(300, 12, 8)
    w, _ = ridge_affine(x, y, ridge=1e-2, rank=3)
    assert int(torch.linalg.matrix_rank(w)) == 3


def test_the_residual_mlp_starts_as_the_procrustes_map() -> None:
    x, y = _unit(200, 16, 9), _unit(200, 16, 10)
    untrained = MAPS.lookup("residual-mlp").fit(x, y, AdapterFitConfig(method="residual-mlp",
                                                                       steps=0))
    plain = MAPS.lookup("procrustes").fit(x, y, AdapterFitConfig())
    with torch.no_grad():
        assert torch.allclose(untrained(x), plain(x), atol=1e-6)


def test_the_residual_mlp_fits_better_than_its_start() -> None:
    x = _unit(600, 16, 11)
    y = torch.nn.functional.normalize(torch.tanh(3 * x) @ torch.randn(
        16, 16, generator=torch.Generator().manual_seed(12)), dim=-1)  # not a rotation
    cfg = AdapterFitConfig(method="residual-mlp", steps=200, lr=3e-3)
    trained = MAPS.lookup("residual-mlp").fit(x, y, cfg)
    plain = MAPS.lookup("procrustes").fit(x, y, cfg)
    with torch.no_grad():
        assert (trained(x) * y).sum(-1).mean() > (plain(x) * y).sum(-1).mean() + 0.02


def test_slerp_endpoints_return_the_inputs_and_stay_on_the_sphere() -> None:
    a, b = _unit(5, 8, 13), _unit(5, 8, 14)
    assert torch.allclose(slerp(a, b, 0.0), a, atol=1e-6)
    assert torch.allclose(slerp(a, b, 1.0), b, atol=1e-6)
    mid = slerp(a, b, 0.5)
    assert torch.allclose(mid.norm(dim=-1), torch.ones(5), atol=1e-6)
    # the midpoint is equally far from both ends
    assert torch.allclose((mid * a).sum(-1), (mid * b).sum(-1), atol=1e-5)
    assert torch.allclose(slerp(a, a, 0.3), a, atol=1e-6)  # parallel rows


def test_config_is_strict_and_checked() -> None:
    with pytest.raises(ConfigError, match="method"):
        AdapterFitConfig(method="rotation")
    with pytest.raises(ConfigError, match="slerp_t"):
        AdapterFitConfig(slerp_t=1.5)
    with pytest.raises(ConfigError, match="no field"):
        AdapterFitConfig.from_dict({"rnk": 2})


@pytest.fixture(scope="module")
def old_new(micro_versions: dict[str, Path]):
    return load_artifact(micro_versions["v1"]), load_artifact(micro_versions["v3"])


@pytest.mark.parametrize("method", ["procrustes", "affine", "residual-mlp"])
def test_an_adapter_route_round_trips_through_its_artifact(method: str, old_new, tmp_path: Path,
                                                            small_world: PairDataset) -> None:
    old, new = old_new
    sample = sample_from_dataset(old, small_world, 60, seed=1)
    cfg = AdapterFitConfig(method=method, steps=5)
    art = fit_adapter(new, sample, cfg, "v1", tmp_path / method, old=old, version_id="v3-ad")
    again = load_artifact(art.path)
    route = again.routes["v1"]
    assert (route["kind"], route["method"], again.space, again.manifest["parent"]) == \
        ("adapter", method, "v3", "v1")
    assert again.manifest["metrics"]["pairs"] == {"image": 60, "text": 60}
    routed = load_encoder(again, "v1")
    native = load_encoder(again)  # the untouched new model
    texts = [r.captions["en"][0] for r in small_world.records[:7]]
    mapped = routed.encode_texts(texts)
    assert mapped.shape == (7, 32)
    np.testing.assert_allclose(native.encode_texts(texts), load_encoder(new).encode_texts(texts),
                               atol=1e-6)
    images = [small_world.load_image(i) for i in range(5)]
    assert routed.encode_images(images).shape == (5, 32)
    # served as fitted: the map sees the embedding (unit rows), not the tower's raw output
    from training.upgrades.adapter.route import load_maps

    maps = load_maps(again, route)
    with torch.no_grad():
        expected = maps["text"](torch.from_numpy(native.encode_texts(texts))).numpy()
    np.testing.assert_allclose(mapped, expected, atol=1e-5)


def test_a_slerp_route_runs_both_models_and_its_ends_are_the_two_routes(
        old_new, tmp_path: Path, small_world: PairDataset) -> None:
    old, new = old_new
    sample = sample_from_dataset(old, small_world, 40, seed=2)
    texts = [r.captions["en"][0] for r in small_world.records[:6]]
    images = [small_world.load_image(i) for i in range(4)]
    plain = load_encoder(fit_adapter(new, sample, AdapterFitConfig(), "v1", tmp_path / "p",
                                     old=old), "v1")
    only_old = load_encoder(fit_adapter(new, sample, AdapterFitConfig(slerp_t=1.0), "v1",
                                        tmp_path / "o", old=old), "v1")
    np.testing.assert_allclose(only_old.encode_texts(texts), load_encoder(old).encode_texts(texts),
                               atol=1e-5)
    np.testing.assert_allclose(only_old.encode_images(images),
                               load_encoder(old).encode_images(images), atol=1e-5)
    half = load_encoder(fit_adapter(new, sample, AdapterFitConfig(slerp_t=0.5), "v1",
                                    tmp_path / "h", old=old), "v1")
    expected = slerp(torch.from_numpy(plain.encode_images(images)),
                     torch.from_numpy(load_encoder(old).encode_images(images)), 0.5)
    np.testing.assert_allclose(half.encode_images(images), expected.numpy(), atol=1e-5)


def test_slerp_needs_the_galleries_own_model(old_new, tmp_path: Path,
                                            small_world: PairDataset) -> None:
    old, new = old_new
    sample = sample_from_dataset(old, small_world, 20)
    with pytest.raises(ConfigError, match="slerp_t"):
        fit_adapter(new, sample, AdapterFitConfig(slerp_t=0.5), "v1", tmp_path / "x", old=None)


def test_a_sample_without_pairs_is_refused(old_new, tmp_path: Path) -> None:
    _, new = old_new
    with pytest.raises(ConfigError, match="fewer than 2"):
        fit_adapter(new, Sample(), AdapterFitConfig(), "v1", tmp_path / "none")


def test_bench_upgrade_reports_every_adapter_row(micro_versions: dict[str, Path],
                                                 tmp_path: Path) -> None:
    """``bench upgrade --skip-xbt`` on micro models: every adapter row, with its gain share,
    flip rates, cost and added latency (the numbers mean nothing at this size)."""
    import shutil

    from training.bench.upgrade import ADAPTER_ROWS, SLERP_ROWS, render
    from training.cli import build_parser

    base = tmp_path / "base"
    shutil.copytree(micro_versions["v1"], base / "old")
    shutil.copytree(micro_versions["v3"], base / "new")
    args = build_parser().parse_args(["bench", "upgrade", "--base", str(base), "--out",
                                      str(tmp_path / "out"), "--sample", "64", "--skip-xbt",
                                      "--seed", "1"])
    from training.bench.upgrade import run

    result = run(args)
    names = [f"{n} new->old" for n, _ in ADAPTER_ROWS] + [f"{n}+slerp new->old"
                                                          for n in SLERP_ROWS]
    assert sorted(result["rows"]) == sorted(names)
    row = result["rows"]["procrustes+slerp new->old"]
    assert row["family"] == "adapter" and row["gpu_class_budget"] is False
    assert 0 <= row["flips"]["t2i"]["negative"] <= 1 and set(row["added_query_ms"]) == {
        "text", "image"}
    assert any(k.startswith("adapter fit on 64 items") for k in result["targets"])
    assert (tmp_path / "out" / "seed-1" / "bench-upgrade.json").is_file()
    assert "procrustes shared new->old" in render(result)


def test_xbt_can_start_phi_from_the_procrustes_fit() -> None:
    """``init="procrustes"``: phi is exactly the Procrustes map before stage 1 trains, and
    records its skip branch so the route rebuilds it."""
    from types import SimpleNamespace

    from training.upgrades.xbt.config import XbtConfig
    from training.upgrades.xbt.stage1 import TextCache, fresh_projector

    new, rotation = _unit(300, 16, 20), torch.linalg.qr(torch.randn(
        16, 16, generator=torch.Generator().manual_seed(21)))[0]
    cache = TextCache(new, new @ rotation)
    p = SimpleNamespace(new_dim=16, target_dim=16, device="cpu")
    phi = fresh_projector(p, cache, XbtConfig(init="procrustes"))
    with torch.no_grad():
        assert torch.allclose(phi(new), new @ rotation, atol=1e-5)
    assert phi.dims()["skip"] is True and "skip" not in fresh_projector(
        p, cache, XbtConfig()).dims()
    with pytest.raises(ConfigError, match="init"):
        XbtConfig(init="identity")
