"""API key authentication and scope checks for every REST endpoint."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.permissions import SAFE_METHODS, BasePermission

from lab.models import ApiKey, ApiKeyScope
from lab.services import api_key_authenticate

INVALID_API_KEY = "Missing, malformed, revoked or unknown API key; send 'Authorization: Bearer lab_...'."


def bearer_token(header: str | bytes) -> str | None:
    """Return the token of an ``Authorization: Bearer <token>`` header value, or None.

    ``header`` is the value as DRF's ``get_authorization_header`` gives it (bytes) or as text;
    the scheme is case-insensitive (RFC 9110 §11.1). None when bytes are not ASCII or the value
    is not exactly the scheme ``Bearer`` and one token. Whose token it is, API key or job token,
    is the caller's to check.
    """
    if isinstance(header, bytes):
        try:
            header = header.decode("ascii")
        except UnicodeDecodeError:
            return None
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1]


def api_key_from_authorization(header: str | bytes) -> ApiKey | None:
    """Return the active API key an ``Authorization: Bearer lab_...`` header value names, or None."""
    token = bearer_token(header)
    return None if token is None else api_key_authenticate(token)


class ApiKeyAuthentication(BaseAuthentication):
    """Authenticate ``Authorization: Bearer lab_...``; ``request.auth`` becomes the ApiKey."""

    def authenticate(self, request) -> tuple[None, ApiKey]:
        api_key = api_key_from_authorization(get_authorization_header(request))
        if api_key is None:
            raise AuthenticationFailed(INVALID_API_KEY)
        return (None, api_key)

    def authenticate_header(self, request) -> str:
        return "Bearer"


class HasProjectScope(BasePermission):
    """Require an API key; safe methods need ``read``, others ``write``.

    A view may set ``required_scope`` to override (e.g. ``"read"`` for ``POST /jobs/estimate``).
    """

    def has_permission(self, request, view) -> bool:
        api_key = request.auth
        if not isinstance(api_key, ApiKey):
            raise AuthenticationFailed(INVALID_API_KEY)
        required = getattr(view, "required_scope", None) or (
            ApiKeyScope.READ if request.method in SAFE_METHODS else ApiKeyScope.WRITE
        )
        if required not in api_key.scopes:
            raise PermissionDenied(f"This API key lacks the '{required}' scope.")
        return True


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Describe API key authentication in the OpenAPI document."""

    target_class = ApiKeyAuthentication
    name = "ApiKey"

    def get_security_definition(self, auto_schema) -> dict:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "lab_...", "description": "A project API key."}
