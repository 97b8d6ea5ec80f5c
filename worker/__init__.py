"""nobackfill worker: Celery tasks that run ``training`` entry points and record results.

Of the gateway it imports only the shared state layer (``service.state``), the job kinds
(``service.jobkinds``: each kind's runner) and ``service.vectors``.

- ``app``        the Celery app (``python -m worker``: one process per GPU)
- ``tasks``      the one task: a job id in, the job run
- ``lifecycle``  a job's life: start, run its kind's runner (``service.jobkinds``), finish
- ``context``    what a runner works with: the job, its parameters, settings, heartbeat,
                 cancellation (``service.jobkinds.base.RunContext``)
"""
