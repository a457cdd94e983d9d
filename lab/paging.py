"""Reading list parameters (integers in bounds, ``limit``) and the list envelope
``{"object": "list", "data": [...], "has_more": bool}`` (docs/api.md "Conventions"), for the
selectors that page their own reads and for the API's cursor paging (``lab.api.pagination``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lab.errors import FieldError, LabError


def int_param(params, name: str, *, minimum: int, maximum: int, default: int | None) -> int | None:
    """Return the integer query parameter ``name`` within [minimum, maximum], or ``default`` when
    absent; raise LabError ``invalid_request`` (``param`` = ``name``) when it is not such an integer."""
    raw = params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = minimum - 1
    if not minimum <= value <= maximum:
        message = f"{name} must be an integer from {minimum} to {maximum}."
        raise LabError("invalid_request", message, errors=[FieldError(name, "out_of_range", message)])
    return value


def parse_limit(params, *, default: int = 20, maximum: int = 100) -> int:
    """Return the ``limit`` query parameter within [1, maximum]; ``invalid_request`` when it is not such a number."""
    return int_param(params, "limit", minimum=1, maximum=maximum, default=default)


def list_envelope(items: Iterable[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """Return the list envelope around already-serialized ``items``."""
    return {"object": "list", "data": list(items), "has_more": has_more}
