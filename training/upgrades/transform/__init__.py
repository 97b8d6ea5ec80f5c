"""Gallery-side transforms: the stored OLD vectors of a gallery carried into NEW's native
space by a small map fitted on a K-item sample, without reading a source or running an
encoder (FCT, Ramanujan et al. 2022), and the order of the backfill that follows
(FastFill, Jaeckle et al. 2023: re-embed first the items whose transformed vector is
predicted to be furthest from the truth).

- ``config``    ``TransformConfig``: which map, the held-out share for the order, seeds
- ``fit``       ``fit_transform``: the per-modality maps OLD -> NEW (the adapter maps,
                ``training.upgrades.adapter.maps``, fitted the other way round) and the
                order predictor; ``GalleryTransform`` (apply, save, load)
- ``order``     backfill orders by name (``id``, ``random``, ``learned``) and the
                predictor of each transformed vector's error
- ``simulate``  a migration's curve on a set of items: R@1 both directions of the side as
                it stands (transformed, then re-embedded in order up to a fraction), of the
                routed old side, and of both fused (the bench and the progressive switch)
"""

from training.upgrades.transform.config import TransformConfig
from training.upgrades.transform.fit import GalleryTransform, fit_transform

__all__ = ["GalleryTransform", "TransformConfig", "fit_transform"]
