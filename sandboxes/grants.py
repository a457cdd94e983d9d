"""Sandbox grants: keys that are no project API key and may use sandboxes alone, within bounds.

A job attempt's sandbox key (``jobs.sandboxes``, docs/sandboxes.md "Sandboxes of a job") is one:
the environment of a job reaches Prime's sandbox API on Lab with it, and may create sandboxes
billed to that attempt's job and see, use and delete those alone. This app knows no job: the
authentication classes that turn such keys into a ``SandboxGrant`` are named in the setting
``LAB_SANDBOX_GRANT_AUTHENTICATION`` (import paths, like DRF's own settings), and only Prime's
sandbox routes (``sandboxes.prime.views``) accept them; every other route refuses them as it
refuses any key it does not know (401).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils.module_loading import import_string

from lab.audit import Actor
from lab.models import Project
from sandboxes.models import Sandbox


@dataclass(frozen=True)
class SandboxGrant:
    """What a grant's holder may do: create sandboxes in ``project`` as ``actor`` through
    ``create`` (a request body -> the sandbox and the body's warnings, raising ``LabError``), and
    see, use and delete the sandboxes of job attempt ``attempt_id`` alone."""

    project: Project
    actor: Actor
    attempt_id: int
    create: Callable[[Any], tuple[Sandbox, list[str]]]

    def sandboxes(self) -> QuerySet:
        """Return the sandboxes this grant reaches: its attempt's, in its project."""
        return Sandbox.objects.for_project(self.project).filter(attempt_id=self.attempt_id)


@cache
def grant_authentication_classes() -> tuple[type, ...]:
    """Return the DRF authentication classes of ``LAB_SANDBOX_GRANT_AUTHENTICATION``: each answers
    None for a key that is not its kind, ``(None, SandboxGrant)`` for a valid one, and raises
    ``AuthenticationFailed`` for an invalid one of its kind."""
    return tuple(import_string(path) for path in settings.LAB_SANDBOX_GRANT_AUTHENTICATION)
