"""nobackfill worker: Celery tasks that run ``training`` entry points and record results.

``app`` is the Celery app; ``tasks`` holds the one task (a job id in, the job run);
``run`` is the job lifecycle (start, heartbeat, progress, cancel, finish); ``kinds``
calls one training entry point per job kind and hands the candidate to ``candidate``
(gate, register, promote).
"""
