"""Direct: the baseline XBT is measured against (a random phi trained end to end against
the old model). :mod:`.method` registers it as ``direct``; :mod:`.train` trains it. Its
settings, adapters and phi are XBT's (:mod:`training.upgrades.xbt`)."""
