"""nobackfill worker: Celery tasks that run ``training`` entry points and record results.

Of the gateway it imports only the shared state layer (``service.state``).

- ``app``        the Celery app (``python -m worker``: one process per GPU)
- ``tasks``      the one task: a job id in, the job run
- ``lifecycle``  a job's life: start, run its kind's runner, finish (status, result)
- ``context``    what a runner works with: the job, settings, heartbeat, cancellation
- ``runners/``   one runner per job kind (``continual``, ``xbt``, ``evaluate``, ``ingest``)
- ``admission``  a trained candidate's way in: gate, register, promote
"""
