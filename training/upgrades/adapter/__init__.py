"""Adapter routes: a NEW model's embeddings mapped into an OLD gallery's space by a map
fitted on stored vectors, with no training of the model and no old model loaded.

Drift-Adapter (EMNLP 2025) and SLERP-BC (Ricci et al.): fit a query-side map on a sample
of K gallery items whose OLD vectors are already stored and whose sources NEW embeds.

- ``maps``     the fitted maps, registered by name: ``procrustes`` (orthogonal, closed
               form), ``affine`` (ridge least squares, optional low rank), ``residual-mlp``
               (Procrustes plus a small residual MLP trained on the pairs)
- ``config``   ``AdapterFitConfig``: which map, per-modality or shared, SLERP weight, ...
- ``fit``      fit from paired vectors and write the version artifact
- ``route``    route kind ``adapter``: the new model's towers, then the map (optionally
               SLERP-mixed with the old model's own query embedding)
"""

from training.upgrades.adapter.config import AdapterFitConfig
from training.upgrades.adapter.maps import MAPS, EmbeddingMap, slerp

__all__ = ["MAPS", "AdapterFitConfig", "EmbeddingMap", "slerp"]
