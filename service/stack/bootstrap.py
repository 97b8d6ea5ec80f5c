"""First start of the embedded default: give an empty registry something to look at.

When the registry holds no version, train a tiny v1 on the synthetic world (or register
``NOBACKFILL_BOOTSTRAP_MODEL``), write a held-out validation set for the gate, create the
gallery ``demo`` in v1's space and ingest ``NOBACKFILL_BOOTSTRAP_IMAGES`` synthetic
images (or ``NOBACKFILL_BOOTSTRAP_DATA``). A later start finds v1 and skips all of it.
It runs before the gateway opens the embedded Qdrant (one process per path).
"""

from __future__ import annotations

import logging
from pathlib import Path

from service.state.config import Settings
from service.state.gallery import GalleryStore, open_qdrant
from service.state.registry import Registry
from service.state.thumbnails import ThumbnailStore
from service.vectors.ingest import ingest_dataset
from service.vectors.writer import DirectWriter
from training.artifacts import Artifact
from training.data import PairDataset

log = logging.getLogger("nobackfill.bootstrap")
GALLERY = "demo"
TINY_OLD = "tiny-old"  # packaged config (training.configs)
BATCH = 256


def bootstrap(settings: Settings) -> bool:
    """Run the demo bootstrap if the registry is empty; True when it ran."""
    registry = Registry(settings.registry_dir)
    if not settings.bootstrap or registry.galleries():
        return False  # set up already (or switched off): later starts reuse it
    work = settings.data_dir / "bootstrap"
    log.info("step 1/4: empty registry at %s: bootstrapping a demo (work dir %s)",
             registry.root, work)
    world, validation = _datasets(settings, work)
    log.info("step 2/4: model v1")
    artifact = _model(settings, work, world)
    log.info("step 3/4: gallery '%s' in space '%s'", GALLERY, artifact.space)
    from training.data import open_dataset

    ingest_images(settings, artifact, open_dataset(world), GALLERY)
    # Registered last: an interrupted bootstrap leaves no gallery, so the next start
    # finishes it (the trained v1 and the rendered images are reused; upserts are
    # idempotent, and registering the same artifact twice is a no-op).
    record = registry.register(artifact.path, by="bootstrap")
    registry.create_gallery(GALLERY, record.space, by="bootstrap", version=record.version_id,
                            validation=str(validation))
    log.info("step 4/4: bootstrap done: version %s serves gallery '%s'", record.version_id,
             GALLERY)
    return True


def _datasets(settings: Settings, work: Path) -> tuple[Path, Path]:
    """(gallery/training set, validation set) directories; synthesised unless configured."""
    from training.data import write_dataset

    validation = work / "validation"
    if not (validation / "manifest.jsonl").is_file():
        size = min(500, max(50, settings.bootstrap_images // 4))
        log.info("rendering %d held-out validation images (the gate's data)", size)
        write_dataset(validation, size, seed=1001, show_progress=True)
    if settings.bootstrap_data:
        return Path(settings.bootstrap_data), validation
    world = work / "world"
    if not (world / "manifest.jsonl").is_file():
        log.info("rendering %d synthetic images", settings.bootstrap_images)
        write_dataset(world, settings.bootstrap_images, seed=1, show_progress=True)
    return world, validation


def _model(settings: Settings, work: Path, world: Path) -> Artifact:
    from training.artifacts import load_artifact
    from training.configs import config_path
    from training.contrastive import train_contrastive
    from training.data import open_dataset
    from training.encoders import ModelSpec
    from training.trainer import TrainConfig

    if settings.bootstrap_model:
        return load_artifact(settings.bootstrap_model)
    out = work / "v1"
    if (out / "manifest.json").is_file():
        return load_artifact(out)  # trained by an interrupted earlier start
    log.info("training a tiny v1 (%s) for %d steps on CPU/GPU", TINY_OLD,
             settings.bootstrap_steps)
    cfg = TrainConfig(steps=settings.bootstrap_steps, batch_size=128, lr=5e-4, warmup=0.05)
    return train_contrastive(ModelSpec.from_json(config_path(TINY_OLD)), open_dataset(world), cfg, out,
                      version_id="v1", device=settings.device)


def ingest_images(settings: Settings, artifact: Artifact, dataset: PairDataset,
                  gallery: str) -> None:
    """Embed every image with ``artifact`` and write it into ``gallery`` (created if
    needed; idempotent by id) through the shared ingest pipeline, with a progress bar.
    Runs while no gateway holds the embedded Qdrant path."""
    from tqdm import tqdm

    from training.versions import load_encoder

    encoder = load_encoder(artifact, artifact.space, settings.device)
    store = GalleryStore(open_qdrant(settings), serialise=settings.qdrant_url is None)
    try:
        store.create(gallery, int(encoder.embed_dim))
        writer = DirectWriter.fixed(store, ThumbnailStore.of(settings), gallery, artifact.space)
        with tqdm(total=len(dataset), desc="ingest", unit="image") as bar:
            ingest_dataset({artifact.space: encoder}, artifact.version_id, writer, dataset,
                           BATCH, on_batch=lambda done, _: bar.update(done - bar.n))
    finally:
        store.close()
