"""The list envelope ``{"object": "list", "data": [...], "has_more": bool}`` and cursor paging.

``limit`` (default 20, max 100 unless the endpoint allows more) and ``after`` (the public id of
the last item seen) follow docs/api.md "Conventions".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db.models import QuerySet

from lab.api.errors import ApiError, FieldError


def int_param(params, name: str, *, minimum: int, maximum: int, default: int | None) -> int | None:
    """Return the integer query parameter ``name`` within [minimum, maximum], or ``default`` when
    absent; raise ApiError 400 (``param`` = ``name``) when it is not such an integer."""
    raw = params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = minimum - 1
    if not minimum <= value <= maximum:
        message = f"{name} must be an integer from {minimum} to {maximum}."
        raise ApiError(400, "invalid_request", message, errors=[FieldError(name, "out_of_range", message)])
    return value


def parse_limit(params, *, default: int = 20, maximum: int = 100) -> int:
    """Return the ``limit`` query parameter within [1, maximum]; 400 when it is not such a number."""
    return int_param(params, "limit", minimum=1, maximum=maximum, default=default)


def list_envelope(items: Iterable[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """Return the list envelope around already-serialized ``items``."""
    return {"object": "list", "data": list(items), "has_more": has_more}


def paginate_by_public_id(
    queryset: QuerySet,
    params,
    serialize: Callable[[Any], dict[str, Any]] | None = None,
    *,
    newest_first: bool = True,
    serialize_page: Callable[[list[Any]], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Page ``queryset`` (already scoped to the tenant) by its ``public_id`` cursor.

    Items are ordered by primary key (newest first by default); ``after`` names the last item of
    the previous page and must belong to the same queryset, otherwise it is a 404 like any id
    the caller cannot see. Items are turned into JSON by ``serialize`` one at a time, or by
    ``serialize_page`` all at once (to read what they share in a constant number of queries).
    """
    limit = parse_limit(params)
    ordered = queryset.order_by("-pk" if newest_first else "pk")
    after = params.get("after")
    if after:
        anchor = queryset.filter(public_id=after).values_list("pk", flat=True).first()
        if anchor is None:
            raise ApiError(404, "not_found", f"No such object: {after[:64]}", param="after")
        ordered = ordered.filter(pk__lt=anchor) if newest_first else ordered.filter(pk__gt=anchor)
    page = list(ordered[: limit + 1])
    items = serialize_page(page[:limit]) if serialize_page else [serialize(item) for item in page[:limit]]
    return list_envelope(items, has_more=len(page) > limit)


def paginate_list(items: list[dict[str, Any]], params, *, key: str = "id") -> dict[str, Any]:
    """Page an already-ordered, already-serialized list (one the database cannot order, such as
    environments sorted by name and version) by the ``key`` of the last item seen: ``after``
    must name an item of ``items`` (else 404, like any id the caller cannot see)."""
    limit = parse_limit(params)
    after = params.get("after")
    start = 0
    if after:
        position = next((index for index, item in enumerate(items) if item.get(key) == after), None)
        if position is None:
            raise ApiError(404, "not_found", f"No such object: {after[:64]}", param="after")
        start = position + 1
    page = items[start:start + limit]
    return list_envelope(page, has_more=start + limit < len(items))
