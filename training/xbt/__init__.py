"""XBT: cross-modal backward-compatible upgrades (METHODS.md, XBT).

- :mod:`.config`: ``XbtConfig`` (every hyperparameter, saved with the artifact) and
  ``AdapterConfig``; free of torch so the CLI's ``--help`` stays fast.
- :mod:`.projector`: phi, pretrained on text only.
- :mod:`.adapters`: removable adapters on the new model (LoRA via peft, LayerNorm
  deltas) and :mod:`.prompts` (visual soft prompts).
- :mod:`.upgrade`: stage 1, stage 2 (no old model), the Direct baseline, the artifact.
- :mod:`.route`: the "projector" route into the old gallery's space.
Import from the submodules; this package imports nothing on purpose.
"""
