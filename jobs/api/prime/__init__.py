"""Prime Intellect's own API shapes over Lab's jobs, so the ``prime`` CLI (0.18.0) drives Lab.

Mounted at ``/prime/api/v1/`` (``lab/urls.py``): ``PRIME_API_BASE_URL=<lab>/prime`` points the
CLI here. Every route is a thin adapter over ``jobs.services``, ``jobs.selectors`` and
``billing.selectors``; docs/prime-compat.md lists what each command maps to.
"""
