"""nobackfill ML library: encoders, data, losses, training, evaluation, artifacts.

Knows nothing of HTTP or job queues (see DESIGN.md: dependencies point one way).
"""

__version__ = "0.1.0"
