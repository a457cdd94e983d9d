"""Artifacts: what a job uploads for Lab to keep, one lifecycle for every kind (docs/checkpoints.md).

``uploading → ready | failed``, then ``ready → deleted`` (retention): the engine registers an
artifact of a step and gets an upload target, uploads one uncompressed tar, completes; Lab seals
and re-hashes what is stored and marks it ``ready`` when size and SHA-256 match (a
``<kind>.ready`` event, and its webhook), else ``failed``. A ready one whose stored archive no
longer has the SHA-256 it was verified with, found when Lab serves it or resumes from it, becomes
``failed`` too. The kinds (a checkpoint: a training state to resume from; an adapter: the trained
weights alone) differ only by the data ``kinds`` declares for each:

- ``kinds``: ``ArtifactKind``, ``CHECKPOINT`` and ``ADAPTER`` (what differs, as data);
- ``lifecycle``: register, complete, fail, retention, the orphan sweep (every status change);
- ``downloads``: the download answer and the check that a stored archive is unchanged;
- ``presenters``: the API object of an artifact.
"""
