"""nobackfill worker: Celery tasks that run ``training`` entry points and record results."""
