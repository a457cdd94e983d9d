"""The list envelope ``{"object": "list", "data": [...], "has_more": bool}`` and cursor paging.

``limit`` (default 20, max 100 unless the endpoint allows more) and ``after`` (the public id of
the last item seen) follow docs/api.md "Conventions".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet

from lab.api.errors import ApiError
from lab.paging import list_envelope, parse_limit

__all__ = ["paginate_by_public_id", "paginate_list"]


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
