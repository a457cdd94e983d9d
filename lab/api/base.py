"""The one base class of every tenant-owned REST endpoint.

``ProjectAPIView`` resolves the project from the API key (never from the URL or the body), and
offers ``scoped(queryset)`` / ``get_owned(queryset, public_id)`` so every lookup is made *with* the
tenant: another tenant's object is the same 404 as a missing one. Every ``post`` a subclass
defines is wrapped for ``Idempotency-Key`` automatically, so no endpoint can forget it.
"""

from __future__ import annotations

from django.db.models import Model, QuerySet
from rest_framework.views import APIView

from lab.api.errors import not_found
from lab.api.idempotency import idempotent
from lab.audit import Actor
from lab.models import ApiKey, Project
from lab.tenancy import MAX_PUBLIC_ID, TenantQuerySet, get_owned


class ProjectAPIView(APIView):
    """Base view: ``self.project`` and ``self.api_key`` come from the authenticated key."""

    #: the field that ties a model to its project; subclasses may point through relations.
    project_field = "project"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        post = cls.__dict__.get("post")
        if post is not None and not getattr(post, "is_idempotent", False):
            cls.post = idempotent(post)

    def initial(self, request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        self.api_key: ApiKey = request.auth
        self.project: Project = self.api_key.project
        self.actor = Actor(api_key=self.api_key)

    def scoped(self, queryset: QuerySet) -> QuerySet:
        """Return ``queryset`` restricted to this key's project."""
        return queryset.filter(**{self.project_field: self.project})

    def get_owned(self, queryset: QuerySet, public_id: str, what: str = "object") -> Model:
        """Return the object with ``public_id`` in this project, or raise the 404 (``lab.tenancy.get_owned``)."""
        if isinstance(queryset, TenantQuerySet):
            return get_owned(queryset, self.project, public_id, what)
        obj = self.scoped(queryset).filter(public_id=public_id).first() if len(public_id) <= MAX_PUBLIC_ID else None
        if obj is None:
            raise not_found(what)
        return obj
