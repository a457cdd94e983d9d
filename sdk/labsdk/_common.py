"""What every resource of the SDK shares: answers parsed into types, ids quoted into paths, and
list endpoints read page by page (docs/api.md "Lists")."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import ValidationError

from labsdk._http import HTTPClient
from labsdk.errors import (
    APIError,
)
from labsdk.types import (
    LabObject,
)

T = TypeVar("T", bound=LabObject)


def parse(model: type[T], data: Any) -> T:
    """Build ``model`` from an answer; an answer of the wrong shape is an ``APIError``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise APIError(f"Lab answered with an unexpected {model.__name__}: {exc}", body=data) from None


def segment(object_id: str) -> str:
    """Quote an id for a URL path so that ``/`` or ``..`` in it cannot change the path."""
    if not isinstance(object_id, str) or not object_id:
        raise ValueError(f"expected a non-empty id string, got {object_id!r}")
    return quote(object_id, safe="")


def paginate(
    http: HTTPClient,
    path: str,
    model: type[T],
    params: Mapping[str, Any],
    *,
    cursor_param: str = "after",
    cursor_field: str = "id",
    cursor: Any = None,
) -> Iterator[T]:
    """Yield every item of a list endpoint after ``cursor``, requesting the next page
    (``cursor_param`` = the last item's ``cursor_field``) only when the previous one is
    used up."""
    while True:
        page = http.request("GET", path, params={**params, cursor_param: cursor})
        items = [parse(model, item) for item in list_data(page, path)]
        yield from items
        if not page.get("has_more") or not items:
            return
        cursor = getattr(items[-1], cursor_field, None)
        if cursor is None:
            raise APIError(f"Lab answered {path} with more pages but no {cursor_field} to ask for them", body=page)


def list_data(page: Any, what: str) -> list:
    """Return the ``data`` of a list envelope; another shape is an ``APIError``."""
    if not isinstance(page, dict) or not isinstance(page.get("data"), list):
        raise APIError(f"Lab answered {what} with something that is not a list", body=page)
    return page["data"]
