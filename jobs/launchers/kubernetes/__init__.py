"""The Kubernetes pool (``LAB_LAUNCHER=kubernetes``): Kueue-queued JobSets, one per attempt.

``gateway`` is the small cluster interface Lab talks through (apply, get, list, watch, delete)
with its implementation on the official ``kubernetes`` client; ``objects`` builds what an
attempt needs (namespace, LocalQueue, Secret, JobSet); ``cache`` keeps what the cluster holds,
fed by list-then-watch; ``status`` reads an attempt's objects as an ``Observation``;
``launcher`` ties them into a ``Launcher``. None of these modules imports Django: the registry
hands them their settings. docs/kubernetes.md pins the names, labels and priority classes.
"""
