"""The version an upgrade that trains phi writes (``xbt``, ``direct``).

A self-contained artifact (base weights included): its native route is the untouched new
model; its route into the target space (kind ``projector``,
:mod:`training.upgrades.xbt.route`) runs the base model + adapters + phi. ``metrics``
records each training loop (``result_metrics``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from open_clip.model import get_model_preprocess_cfg

from training.artifacts import WEIGHTS, Artifact, new_version_id, write_artifact
from training.trainer import TrainResult
from training.upgrades.prepare import Prepared
from training.upgrades.slerp import OLD_WEIGHTS, old_weights
from training.upgrades.xbt.config import XbtConfig
from training.upgrades.xbt.projector import Projector

ADAPTERS_FILE = "adapters.safetensors"
PROJECTOR_FILE = "projector.safetensors"


def result_metrics(result: TrainResult) -> dict[str, Any]:
    """A training loop's record in the artifact (a resumed loop's losses are those of the
    steps it took after ``resumed_from``)."""
    return {"steps": result.steps, "seconds": result.seconds,
            "final_loss": result.final_loss if result.losses else None,
            "first_loss": result.losses[0] if result.losses else None,
            "resumed_from": result.resumed_from}


def projector_route_entry(p: Prepared, phi: Projector, cfg: XbtConfig) -> dict[str, Any]:
    """The manifest's entry for the route into the target space: base model + adapters +
    phi (``training.upgrades.xbt.route.load_projector_route`` builds the encoder from it). With the
    adapters switched off (selection chose stage 1 alone) the route is phi on the untouched
    base model: ``adapters`` and ``adapter_config`` are None."""
    on = p.adapters.enabled
    return {"kind": "projector", "adapters": ADAPTERS_FILE if on else None,
            "projector": PROJECTOR_FILE,
            "adapter_config": cfg.adapter_config().to_dict() if on else None,
            "projector_dims": phi.dims(), "embed_dim": phi.out_dim}


def write_upgrade(p: Prepared, phi: Projector, cfg: XbtConfig, metrics: dict[str, Any],
                  out: str | Path, version_id: str | None = None) -> Artifact:
    """Write the upgraded version: self-contained (base weights included), atomic."""
    vid = version_id or new_version_id()
    space = p.native_space or vid
    manifest = {
        "version_id": vid, "space": space, "kind": "xbt", "method": cfg.method,
        "parent": p.old.version_id, "target_space": p.target_space,
        "model_spec": p.spec.to_dict(), "base_model": p.spec.describe(),
        "embed_dim": p.new_dim, "preprocess": dict(get_model_preprocess_cfg(p.model)),
        "languages": [cfg.language], "hyperparameters": cfg.to_dict(), "metrics": metrics,
        "routes": {space: {"kind": "native"},
                   p.target_space: projector_route_entry(p, phi, cfg)},
    }
    tensors = {WEIGHTS: p.base_state,
               PROJECTOR_FILE: {k: v.detach() for k, v in phi.state_dict().items()}}
    if p.adapters.enabled:
        tensors[ADAPTERS_FILE] = p.adapters.state_dict()
    if cfg.slerp_t > 0:  # the route mixes with OLD's own query: OLD's weights travel along
        route = manifest["routes"][p.target_space]
        route["slerp_t"] = cfg.slerp_t
        tensors[OLD_WEIGHTS] = old_weights(p.old, p.target_space, route)
    return write_artifact(out, manifest, tensors)
