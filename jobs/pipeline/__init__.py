"""The run pipeline: what happens to a job between admission and its end (docs/api.md "Engine exit codes").

- ``launch``: a claimed attempt goes to the launcher;
- ``observe``: the launcher is asked about launched attempts, with no row locked;
- ``apply``: what was seen of a job is applied under its lock;
- ``outcomes``: the exit-code table, a pure ``decide``;
- ``usage``: usage intervals closed in the billing ledger, the jobs' totals;
- ``batch``: a pass's ended attempts finished together;
- ``kueue``: waiting reasons, parked JobSets and queue places on the Kubernetes pool;
- ``sweep``: engine processes no attempt accounts for are ended;
- ``reconciler``: the entry points, ``reconcile_job`` and the periodic ``reconcile_all``.

Imports run one way: ``reconciler`` over ``batch`` over ``apply`` over ``usage``, ``kueue`` and
``observe``; ``outcomes`` imports no database code. The Celery tasks (``jobs.tasks``) call
``launch.attempt_launch`` and ``reconciler``'s entry points.
"""
