"""Tenancy that fails closed: querysets of tenant-owned models refuse to run without a tenant.

A tenant-owned model (a job, a checkpoint, a webhook endpoint, ...) sets ``tenant_path``, the
lookup from it to its ``Project`` (``"project"``, ``"job__project"``), and uses
``TenantManager`` as ``objects``. A model that an organization owns for all its projects (an
environment package) sets ``tenant_owner = "organization"`` and a ``tenant_path`` to its
``Organization`` instead; a project then sees its organization's rows. Its querysets run only
once they are scoped:

- ``for_project(project)``: the rows of one project (API keys belong to one project);
- ``for_member(user)``: the rows of every organization ``user`` is a member of (dashboard sessions);
- a filter on a row that is itself scoped (``tenant_parents``: ``Checkpoint.objects.filter(job=job)``),
  which is also how related managers (``project.jobs``, ``job.checkpoints``) are scoped;
- ``unscoped()``: an explicit, greppable bypass for system code that acts on every tenant (the
  reconciler, admission, the ingest API under a job token, the admin).

Anything else raises ``UnscopedQuery`` when it would touch the database, so a new endpoint that
forgets its tenant fails its first test instead of serving another tenant's rows. ``get_owned``
is the one lookup by public id for API, dashboard and stream: another tenant's object is the same
404 as a missing one. Model internals (saving, refreshing, deleting cascades, forward relations)
use Django's plain base manager and are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import models

from lab.errors import not_found

#: The longest public id Lab issues (prefix + random part); longer ones cannot exist.
MAX_PUBLIC_ID = 64


class UnscopedQuery(Exception):
    """A query on a tenant-owned model ran without a tenant (a bug: scope it, or say ``unscoped()``)."""


class TenantQuerySet(models.QuerySet):
    """A queryset that runs only after it was scoped to a tenant (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._tenant_scoped = False

    def _clone(self) -> TenantQuerySet:
        clone = super()._clone()
        clone._tenant_scoped = self._tenant_scoped
        return clone

    def _scoped(self, queryset: TenantQuerySet) -> TenantQuerySet:
        queryset._tenant_scoped = True
        return queryset

    def for_project(self, project) -> TenantQuerySet:
        """Return the rows of ``project`` (of its organization, for organization-owned models)."""
        if _owned_by_organization(self.model):
            return self.for_organization(project.organization_id)
        return self._scoped(self.filter(**{self.model.tenant_path: project}))

    def for_organization(self, organization) -> TenantQuerySet:
        """Return the rows of ``organization`` (an Organization or its row id); organization-owned
        models only (``tenant_owner = "organization"``): a project's rows are ``for_project``'s."""
        if not _owned_by_organization(self.model):
            raise TypeError(f"{self.model.__name__} rows belong to projects: scope them with for_project()")
        return self._scoped(self.filter(**{self.model.tenant_path: organization}))

    def for_member(self, user) -> TenantQuerySet:
        """Return the rows of the organizations ``user`` is a member of."""
        organization = self.model.tenant_path if _owned_by_organization(self.model) else f"{self.model.tenant_path}__organization"
        return self._scoped(self.filter(**{f"{organization}__memberships__user": user}))

    def unscoped(self) -> TenantQuerySet:
        """Return this queryset allowed to run across tenants (system code and the admin only)."""
        return self._scoped(self._chain())

    def _filter_or_exclude(self, negate: bool, args, kwargs) -> TenantQuerySet:
        clone = super()._filter_or_exclude(negate, args, kwargs)
        if not negate and any(key.removesuffix("__in").removesuffix("_id") in _scope_keys(self.model) for key in kwargs):
            clone._tenant_scoped = True
        return clone

    def _require_scope(self) -> None:
        if not self._tenant_scoped:
            raise UnscopedQuery(
                f"{self.model.__name__} rows are tenant-owned: scope the query with for_project() or "
                "for_member(), or say unscoped() where system code acts on every tenant"
            )

    def _fetch_all(self) -> None:
        if self._result_cache is None:
            self._require_scope()
        super()._fetch_all()

    def iterator(self, *args: Any, **kwargs: Any):
        self._require_scope()
        return super().iterator(*args, **kwargs)

    def count(self) -> int:
        if self._result_cache is None:
            self._require_scope()
        return super().count()

    def exists(self) -> bool:
        if self._result_cache is None:
            self._require_scope()
        return super().exists()

    def aggregate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._require_scope()
        return super().aggregate(*args, **kwargs)

    def update(self, **kwargs: Any) -> int:
        self._require_scope()
        return super().update(**kwargs)

    def delete(self):
        self._require_scope()
        return super().delete()


def _owned_by_organization(model: type[models.Model]) -> bool:
    return getattr(model, "tenant_owner", "project") == "organization"


def _scope_keys(model: type[models.Model]) -> set[str]:
    return {model.tenant_path, *getattr(model, "tenant_parents", ())}


class TenantManager(models.Manager.from_queryset(TenantQuerySet)):
    """The manager of tenant-owned models: its querysets fail closed (``TenantQuerySet``)."""

    def bulk_update(self, objs, fields, batch_size=None) -> int:
        """Update rows the caller already holds (no tenant lookup happens: the rows are given)."""
        return models.QuerySet(self.model, using=self._db).bulk_update(objs, fields, batch_size=batch_size)


def get_owned(
    queryset: TenantQuerySet,
    project,
    public_id: str,
    what: str = "object",
    *,
    error: Callable[[str], Exception] | None = None,
) -> models.Model:
    """Return the object with ``public_id`` in ``project`` from ``queryset``, or raise the 404 that
    a missing object and another tenant's object share: ``lab.errors.not_found(what)`` (the
    domain's ``not_found``), or ``error(what)`` (e.g. the dashboard's Http404)."""
    found = queryset.for_project(project).filter(public_id=public_id).first() if len(public_id) <= MAX_PUBLIC_ID else None
    if found is None:
        if error is not None:
            raise error(what)
        raise not_found(what)
    return found
