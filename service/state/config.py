"""The gateway's process settings: one pydantic-settings class, read from ``NOBACKFILL_*``.

Model hyperparameters never live here (they travel inside artifacts); this is only
where things are (paths, URLs), who may call (keys) and how the process behaves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MEMORY = ":memory:"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NOBACKFILL_", extra="ignore")

    data_dir: Path = Field(Path("data"), description="root of local state (registry, qdrant)")
    registry_root: Path | None = Field(
        None, description="model versions + index + gallery state; default DATA_DIR/registry")
    qdrant_url: str | None = Field(None, description="Qdrant server URL; unset: embedded local")
    qdrant_api_key: SecretStr | None = None
    qdrant_engine: Literal["edge", "local"] = Field(
        "edge", description="the embedded engine when no URL is set: edge (Qdrant Edge, "
        "Qdrant's engine in-process: HNSW, 1M points) or local (qdrant-client's local mode: "
        "pure Python, brute force, up to about 20,000 points)")
    qdrant_path: str | None = Field(
        None, description="embedded store path (default DATA_DIR/qdrant-edge for edge, "
        "DATA_DIR/qdrant for local) or ':memory:' (edge: a temporary directory)")
    qdrant_durability: Literal["process", "power"] = Field(
        "process", description="when an embedded store acknowledges a write: process (applied "
        "and in its write-ahead log: survives a kill of the gateway, not a power cut) or power "
        "(on disk: flushed before the answer, one flush for the writes that waited together); "
        "a server keeps its own setting")
    qdrant_search_ef: int | None = Field(
        None, ge=1, le=4096, description="the HNSW ef of every gallery search, on every "
        "backend; unset: the engine's own (the collection's ef_construct, 64). Higher finds "
        "more of the true nearest points, slower: at 1,000,000 points on Edge, 64 gives "
        "recall@10 0.956 at 3.3 ms, 128 gives 0.992 at 4.3 ms (bench store)")
    datasets_dir: Path | None = Field(
        None, description="where datasets (manifests and their images) and model sources live; "
        "default DATA_DIR/datasets")
    allowed_roots: Annotated[tuple[Path, ...], NoDecode] = Field(
        (), description="more directories that paths in requests (datasets, validation sets, "
        "corpora, checkpoints, model sources) may name, besides DATA_DIR, the registry and "
        "DATASETS_DIR: a JSON list, or paths separated by ':'")
    admin_api_keys: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='JSON object name -> key, e.g. {"ops": "s3cret"}; the name is recorded '
                    "as who promoted or rolled back")
    read_api_key: SecretStr | None = Field(None, description="if set, search needs a key")
    batch_max_size: int = Field(32, ge=1, le=4096, description="1 turns dynamic batching off")
    batch_max_wait_ms: float = Field(
        2.0, ge=0, le=10_000, description="how long a lone query waits for company when the "
        "device is idle (under load, batches fill while the previous forward runs)")
    top_k_max: int = Field(100, ge=1, le=10_000)
    # Rerank on read (service/usecases/rerank.py): the route's candidates a search has NEW
    # rank, and the time a search waits for NEW to embed the ones the new side lacks
    # (past it, those keep the route's order; their embedding still finishes and fills).
    rerank_k: int = Field(20, ge=1, le=1000)
    rerank_budget_ms: float = Field(250.0, gt=0, le=60_000)
    rerank_k_max: int = Field(
        100, ge=1, le=1000, description="largest rerank_k a search may ask for (more: 422); "
        "a migration's or the server's rerank_k above it is cut to it. A search whose top_k "
        "exceeds its rerank_k (its migration's, or the server's) has NEW rank "
        "min(top_k, rerank_k_max) candidates; the rest of its top_k follow in the route's "
        "order")
    rerank_embed_max_per_request: int = Field(
        32, ge=0, le=1000, description="items one reranked search may start embedding for "
        "the new side (each with every kind it has); the candidates past it that the new "
        "side lacks keep their place in the route's order, are not queued, and count in "
        "nobackfill_rerank_embeds_refused_total (a search joining an embedding another "
        "search started costs nothing); 0: a search never embeds, it reranks what the new "
        "side holds. Default 32: at least the default rerank_k (20), so a default rerank "
        "embeds all its candidates, and the default batch_max_size, so one search's fills "
        "make at most one forward per kind")
    # What users retrieve (service/state/candidates.py): the backfill order
    # ``candidates`` and the plan's warm curves read these counts.
    candidate_half_life_s: float = Field(
        86_400.0, gt=0, description="half-life of the served-candidate counts (seconds): a "
        "count halves when the item is not served for this long, so the backfill order "
        "candidates follows today's workload")
    candidate_items_max: int = Field(200_000, ge=1, le=10_000_000, description="items whose "
                                     "served-candidate count a gallery keeps (the most "
                                     "counted)")
    candidate_sets_max: int = Field(
        20_000, ge=0, le=1_000_000, description="distinct sets of served candidates whose "
        "count a gallery keeps (the most served; a query that comes back serves the same "
        "set): the backfill order candidates re-embeds the sets served most first; 0 keeps "
        "none (the order then learns from the last searches only)")
    candidate_searches_kept: int = Field(
        5_000, ge=0, le=1_000_000, description="last searches whose candidate ids (no query) "
        "a gallery keeps, for the plan's warm curves; 0: none")
    rerank_score: Literal["new", "fused"] = Field(
        "new", description="how a rerank ranks the candidates: new (the new model's cosine) "
        "or fused (the new model's cosine plus the route's; bench frontier, 50,000 items, two "
        "seeds: +0.009 R@1 image->text beyond the error, +0.002 text->image within it)")
    max_image_pixels: int = Field(40_000_000, ge=1, description="larger images get 413")
    max_image_bytes: int = Field(20 * 2**20, ge=1, description="larger uploads get 413")
    decode_pixel_budget: int | None = Field(
        None, ge=1, description="pixels that the image decodes in flight may hold at once, "
        "over every request of the process (at most 4 bytes each while decoding); a decode "
        "that does not fit waits its turn (first come, first served), and one larger than "
        "the whole budget runs alone; unset: MAX_IMAGE_PIXELS (one max-size image at a time)")
    decode_wait_s: float = Field(
        30.0, ge=0, description="how long an image waits for room in the decode budget "
        "before the request gets 503 (retry later)")
    max_request_bytes: int = Field(
        256 * 2**20, ge=1, description="multipart/form-data request bodies (image uploads): "
        "larger ones get 413, counted as they arrive (chunked ones too); also caps every body")
    max_json_bytes: int = Field(
        8 * 2**20, ge=1, description="every other request body (JSON, forms without files): "
        "larger ones get 413; a JSON body is read whole into memory, so send large images "
        "as multipart/form-data")
    ingest_max_items: int = Field(256, ge=1, description="items per ingest request")
    keep_warm_versions: int = Field(
        1, ge=0, description="retired versions kept loaded so a rollback swaps at once")
    device: str | None = Field(None, description="torch device; default cuda when present")
    blas_threads: int = Field(
        1, ge=0, description="threads for numpy's BLAS in the gateway (the embedded Qdrant's "
        "search); its spinning idle threads slow the model's forward; 0: library default")
    torch_threads: int = Field(
        1, ge=0, description="torch's threads for the gateway's model forwards (its device "
        "lane) on a CPU: one leaves the other cores to the image decodes, the searches and "
        "a worker on the same host, and no forward waits at an OpenMP barrier for a "
        "preempted thread; 0: torch's default (one per core)")
    registry_poll_interval_s: float = Field(
        1.0, ge=0, description="how often to look for promotions/rollbacks; 0 disables")
    access_log: bool = Field(True, description="uvicorn's per-request log lines")
    # Jobs (the gateway enqueues them, Celery workers run them; both read these).
    broker_url: str | None = Field(
        None, description="Celery broker, e.g. redis://redis:6379/0; unset: an embedded "
        "filesystem broker under DATA_DIR/broker (no server needed)")
    result_backend: str | None = Field(
        None, description="Celery result backend, e.g. redis://redis:6379/1; unset: files "
        "under DATA_DIR/broker/results")
    training_queue: str = Field("training", description="the Celery queue of training jobs")
    broker_timeout_s: float = Field(
        3.0, gt=0, description="how long job submission waits for the broker before 503")
    job_heartbeat_s: float = Field(
        2.0, gt=0, description="how often a running job writes its progress and heartbeat")
    job_stale_after_s: float = Field(
        60.0, gt=0, description="a running job silent this long is failed as 'worker lost'")
    worker_heartbeat_s: float = Field(
        5.0, gt=0, description="how often a worker writes its liveness record "
        "(REGISTRY_ROOT/workers)")
    worker_stale_after_s: float = Field(
        30.0, gt=0, description="job submission answers 503 when no worker has written its "
        "liveness record for this long")
    migration_rate_limit: float = Field(
        0.0, ge=0, description="items/s a migration's backfill may embed over all its shards "
        "(a job's rate_limit overrides it); 0: no limit")
    migration_read_ahead: int | None = Field(
        None, ge=0, le=8, description="batches a migration's backfill reads (decodes, "
        "preprocesses) ahead of the forward, in a thread; 0 reads in line; unset: 1 when "
        "the worker embeds on CUDA, 0 on the CPU (there the reader takes the forward's cores)")
    apply_interval_s: float = Field(
        0.5, ge=0, description="how often the gateway applies what workers spooled (ingest "
        "and migrate jobs) and drives migrations; 0 turns it off (tests drive it)")
    gate_margin: float = Field(
        0.0, ge=0, le=1, description="the gate needs new->old R@1 >= old->old R@1 + margin")
    gate_retention_limit: float = Field(
        0.02, ge=0, le=1, description="continual phases: largest allowed R@1 drop on the "
        "gallery's old domains (validation items outside the phase's domain)")
    gate_max_negative_flip: float | None = Field(
        None, ge=0, le=1, description="largest allowed negative-flip rate per direction (the "
        "fraction of validation queries whose top-1 was relevant under old->old and is not "
        "under new->old); unset: reported, not bounded")
    # First start of the embedded default (`make serve`): a demo to look at.
    bootstrap: bool = Field(
        True, description="when the registry is empty at start: train (or register) v1, "
        "create the gallery 'demo' and ingest images into it")
    bootstrap_images: int = Field(2000, ge=1, le=1_000_000,
                                  description="synthetic gallery size of the bootstrap")
    bootstrap_steps: int = Field(400, ge=1, description="training steps of the bootstrap v1")
    bootstrap_model: str | None = Field(
        None, description="an artifact directory to register as v1 instead of training one")
    bootstrap_data: str | None = Field(
        None, description="a dataset (directory with manifest.jsonl) to ingest instead of "
        "the synthetic world")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)

    @field_validator("allowed_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        """One env value carries several paths: a JSON list, or ':'-separated like PATH."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part for part in text.split(os.pathsep) if part]

    @property
    def registry_dir(self) -> Path:
        return self.registry_root or self.data_dir / "registry"

    @property
    def datasets_root(self) -> Path:
        return self.datasets_dir or self.data_dir / "datasets"

    @property
    def path_roots(self) -> tuple[Path, ...]:
        """Every directory a path named in a request may lie under (``service.state.paths``)."""
        return (self.data_dir, self.registry_dir, self.datasets_root, *self.allowed_roots)

    @property
    def qdrant_location(self) -> str:
        """Where the embedded Qdrant keeps its data (a path or ':memory:')."""
        default = "qdrant-edge" if self.qdrant_engine == "edge" else "qdrant"
        return self.qdrant_path or str(self.data_dir / default)

    @property
    def broker_dir(self) -> Path:
        """Where the embedded (filesystem) broker keeps its messages and results."""
        return self.data_dir / "broker"

    @property
    def decode_budget_pixels(self) -> int:
        return self.decode_pixel_budget or self.max_image_pixels

    @property
    def batch_max_wait_s(self) -> float:
        return self.batch_max_wait_ms / 1000.0
