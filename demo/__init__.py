"""The main job end to end on one machine: ``python -m demo`` (``make demo`` installs, then runs it).

It starts Lab's own processes (uvicorn, a Celery worker, Celery beat) on whatever the
environment configures (embedded SQLite and a server-less broker by default), bootstraps a demo
tenant, registers a local webhook receiver, and then does what a user's program does with the
SDK: submits ``examples/addition-smollm2.toml``, follows the job live, downloads its final
checkpoint, verifies the webhooks, and prints a summary with a pass/fail line per check.

Environment (all optional): ``DEMO_MODEL`` (catalogue id; ``lab/tiny-random-llama`` for a fast
run that checks everything but learning), ``DEMO_MAX_STEPS``, ``DEMO_PORT`` (default 8000),
``DEMO_EXIT=1`` (stop after the summary; exit status 0 only when every check passed),
``DEMO_TIMEOUT_S`` (how long to follow the job, default 1800), ``DEMO_PASSWORD`` (the dashboard
login's password; a random one otherwise), and Lab's own variables (``LAB_DATA_DIR``,
``DATABASE_URL``, ``REDIS_URL``, ...), which pass on to the processes it starts.
"""
