"""Prime's sandbox control plane (``/prime/api/v1/sandbox...``) over ``sandboxes.services``: thin
adapters in Prime's shapes (``serializers.py``), errors as ``{"detail": ...}`` (a refused body
is a 422, as Prime's API answers). Authentication, scopes, rate limits and tenancy are the rest
of Lab's API's: a Lab API key, another project's sandbox the same 404 as a missing one. A sandbox
grant (``sandboxes.grants``: a job attempt's sandbox key) is accepted here and nowhere else: it
creates sandboxes of its attempt and reaches those alone, any other the same 404."""

from __future__ import annotations

import math
from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from lab.api.auth import ApiKeyAuthentication, HasProjectScope
from lab.api.base import ProjectAPIView
from lab.api.errors import exception_handler as lab_exception_handler
from lab.api.errors import not_found
from lab.errors import LabError
from lab.paging import int_param
from sandboxes.grants import SandboxGrant, grant_authentication_classes
from sandboxes.logs import sandbox_logs
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus
from sandboxes.prime.serializers import (
    STATUSES,
    create_body,
    error_context,
    gateway_auth,
    labels_to_lab,
    sandbox_to_prime,
)
from sandboxes.services import (
    sandbox_access,
    sandbox_bulk_delete,
    sandbox_create,
    sandbox_delete,
    sandbox_list,
)

_KEPT_HEADERS = ("Retry-After", "WWW-Authenticate")


def prime_sandbox_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Answer as Lab's handler would, with the body reshaped to Prime's ``{"detail": ...}``."""
    response = lab_exception_handler(exc, context)
    if response is None:
        return None
    error = response.data["error"]
    status, detail = response.status_code, error["message"]
    if status == 400:
        status = 422
        detail = "; ".join(f"{item['param']}: {item['message']}" for item in error.get("errors") or []) or detail
    headers = {name: response[name] for name in _KEPT_HEADERS if response.has_header(name)}
    return Response({"detail": detail}, status=status, headers=headers)


class _HasProjectScopeOrGrant(BasePermission):
    """A sandbox grant may use every route here (on its own sandboxes); an API key needs its scope."""

    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, SandboxGrant) or HasProjectScope().has_permission(request, view)


class _PrimeSandboxView(ProjectAPIView):
    schema = None  # Lab's OpenAPI document describes Lab's own API only
    permission_classes = [_HasProjectScopeOrGrant]

    def get_authenticators(self):
        # A grant's authentication answers None for keys not of its kind, so it goes before the
        # API key's, which refuses anything else.
        return [cls() for cls in grant_authentication_classes()] + [ApiKeyAuthentication()]

    def initial(self, request, *args, **kwargs) -> None:
        if not isinstance(request.auth, SandboxGrant):
            super().initial(request, *args, **kwargs)
            self.grant = None
            return
        APIView.initial(self, request, *args, **kwargs)
        self.grant: SandboxGrant | None = request.auth
        self.api_key, self.project, self.actor = None, self.grant.project, self.grant.actor

    def get_exception_handler(self):
        return prime_sandbox_exception_handler

    def sandbox(self, sandbox_id: str) -> Sandbox:
        if self.grant is not None:
            sandbox = self.grant.sandboxes().select_related("project__organization").filter(public_id=sandbox_id).first()
            if sandbox is None:
                raise not_found("sandbox")
            return sandbox
        return self.get_owned(Sandbox.objects.select_related("project__organization"), sandbox_id, "sandbox")

    def create(self, data) -> Sandbox:
        """Create a sandbox from Lab's body ``data``: the grant's, or the key's project's."""
        if self.grant is not None:
            return self.grant.create(data)[0]
        return sandbox_create(project=self.project, actor=self.actor, data=data)[0]

    @property
    def attempt_id(self) -> int | None:
        """The job attempt whose sandboxes alone this caller reaches (a grant's), else None."""
        return None if self.grant is None else self.grant.attempt_id


class SandboxesView(_PrimeSandboxView):
    """``POST /sandbox`` (create, answered with ``gatewayAuth``), ``GET /sandbox`` (pages of
    ``page``/``per_page``, by ``status``, ``labels``, ``is_active``), ``DELETE /sandbox`` (bulk)."""

    def post(self, request: Request) -> Response:
        sandbox = self.create(create_body(request.data))
        body = sandbox_to_prime(sandbox)
        if sandbox.status == SandboxStatus.RUNNING:
            body["gatewayAuth"] = gateway_auth(sandbox, sandbox_access(sandbox=sandbox))
        return Response(body, status=201)

    def get(self, request: Request) -> Response:
        page = int_param(request.query_params, "page", default=1, minimum=1, maximum=100_000)
        per_page = int_param(request.query_params, "per_page", default=50, minimum=1, maximum=100)
        sandboxes = sandbox_list(
            project=self.project, labels=labels_to_lab(request.query_params.getlist("labels")), attempt_id=self.attempt_id
        )
        status = request.query_params.get("status")
        if status:
            lab_statuses = [lab for lab, prime in STATUSES.items() if prime == status.upper()]
            sandboxes = sandboxes.filter(status__in=lab_statuses)
        if request.query_params.get("is_active", "").lower() == "true":
            sandboxes = sandboxes.filter(status__in=ACTIVE_STATUSES)
        total = sandboxes.count()
        rows = sandboxes.order_by("-id")[(page - 1) * per_page:page * per_page]
        return Response({"sandboxes": [sandbox_to_prime(sandbox) for sandbox in rows], "total": total, "page": page,
                         "perPage": per_page, "hasNext": page < math.ceil(total / per_page)})

    def delete(self, request: Request) -> Response:
        data = request.data if isinstance(request.data, dict) else {}
        sandbox_ids = data.get("sandbox_ids") or []
        if not isinstance(sandbox_ids, list) or not all(isinstance(item, str) for item in sandbox_ids):
            raise LabError("invalid_request", "sandbox_ids must be a list of sandbox ids.", param="sandbox_ids")
        labels = labels_to_lab(data.get("labels") or [])
        if not sandbox_ids and not labels:
            raise LabError("invalid_request", "Name sandbox_ids or labels.", param="sandbox_ids")
        deleted, missing = sandbox_bulk_delete(
            project=self.project, actor=self.actor, sandbox_ids=sandbox_ids, labels=labels, attempt_id=self.attempt_id
        )
        return Response({
            "succeeded": deleted, "failed": [{"sandbox_id": sandbox_id, "error": "Sandbox not found"} for sandbox_id in missing],
            "message": f"Deleted {len(deleted)} sandbox(es); {len(missing)} not found.",
        })


class SandboxView(_PrimeSandboxView):
    """``GET /sandbox/{id}`` and ``DELETE /sandbox/{id}`` (the sandbox stops, its files are deleted)."""

    def get(self, request: Request, sandbox_id: str) -> Response:
        return Response(sandbox_to_prime(self.sandbox(sandbox_id)))

    def delete(self, request: Request, sandbox_id: str) -> Response:
        sandbox = sandbox_delete(sandbox=self.sandbox(sandbox_id), actor=self.actor)
        return Response({"success": True, "sandbox_id": sandbox.public_id, "status": "TERMINATED"})


class SandboxAuthView(_PrimeSandboxView):
    """``POST /sandbox/{id}/auth``: the gateway (this Lab's sandbox agent) and a token for this sandbox alone."""

    def post(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.sandbox(sandbox_id)
        return Response(gateway_auth(sandbox, sandbox_access(sandbox=sandbox)))


class SandboxLogsView(_PrimeSandboxView):
    """``GET /sandbox/{id}/logs``: ``{"logs"}``, what its commands printed (``sandbox_logs``: an
    ended sandbox's as Lab kept it, a 409 when none was kept); a key needs ``write``, as for Lab's route."""

    required_scope = "write"

    def get(self, request: Request, sandbox_id: str) -> Response:
        return Response({"logs": sandbox_logs(sandbox=self.sandbox(sandbox_id), actor=self.actor).logs})


class SandboxErrorContextView(_PrimeSandboxView):
    """``GET /sandbox/{id}/error-context``: its status and, when it ended, why."""

    def get(self, request: Request, sandbox_id: str) -> Response:
        return Response(error_context(self.sandbox(sandbox_id)))


class UnsupportedSandboxRouteView(_PrimeSandboxView):
    """Every other path under ``sandbox/``: a 404 naming the page that lists what is supported."""

    required_scope = "read"

    def _not_here(self, request: Request, path: str = "") -> Response:
        raise LabError("not_found", "Lab's Prime-compatible API does not serve this route; see docs/prime-compat.md.")

    get = post = put = patch = delete = _not_here
