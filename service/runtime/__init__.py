"""What answers queries: loaded model versions (embedders), dynamic batching, and the
single swappable reference that maps each gallery to the version serving it."""
