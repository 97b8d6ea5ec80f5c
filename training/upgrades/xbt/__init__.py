"""XBT: cross-modal backward-compatible upgrades (METHODS.md, XBT).

- :mod:`.config`: ``XbtConfig`` (every hyperparameter, saved with the artifact; also the
  Direct baseline's) and ``AdapterConfig``; free of torch so the CLI's ``--help`` stays fast.
- :mod:`.method`: the method ``xbt``, registered by name.
- :mod:`.projector`: phi; :mod:`.adapters`: removable adapters on the new model (LoRA via
  peft, LayerNorm deltas) and :mod:`.prompts` (visual soft prompts).
- :mod:`.stage1`: phi pretrained on cached text embeddings; :mod:`.stage2`: the adapters
  and phi's LayerNorms on pairs, no old model; :mod:`.selection`: which stage 2
  checkpoint ships.
- :mod:`.route`: route kind ``projector``, into the old gallery's space.
"""
