"""Sandbox labels: which keys a label may have, and the query for the sandboxes carrying some
labels, portable between PostgreSQL and SQLite (the embedded default), whose JSON support
differs (Django's ``contains`` lookup on a JSON field is PostgreSQL's alone)."""

from __future__ import annotations

import re

from django.db.models import QuerySet
from django.db.models.fields.json import KeyTransform

#: A label key, like Kubernetes' (at most 63 characters).
LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,61}[A-Za-z0-9])?$")


def with_labels(sandboxes: QuerySet, labels: dict[str, str]) -> QuerySet:
    """Return those of ``sandboxes`` carrying every label of ``labels`` (none when a key cannot be
    a label's). Each key is one JSON key, never read as lookups (``a__contains`` is a key)."""
    for index, (key, value) in enumerate(labels.items()):
        if not LABEL_KEY.match(key):
            return sandboxes.none()
        sandboxes = sandboxes.alias(**{f"label_{index}": KeyTransform(key, "labels")}).filter(**{f"label_{index}": value})
    return sandboxes
