"""Bodies of the webhook endpoint API (docs/api.md), validated with pydantic.

``POST /webhook-endpoints`` is an ``EndpointCreate``, ``PATCH /webhook-endpoints/{id}`` an
``EndpointUpdate``; ``parse_endpoint_create`` and ``parse_endpoint_update`` validate a body and
raise LabError ``invalid_request`` listing every problem in Lab's own terms:

| field | code | when |
|---|---|---|
| any other key | ``unknown_field`` | only ``url``, ``events`` and ``enabled`` exist |
| ``url`` | ``required`` | missing on create, or ``null`` |
| ``url`` | ``invalid_url`` | not a string, blank, or not sendable as written |
| ``url`` | ``url_too_long``, ``unsupported_scheme``, ``private_address``, ``blocked_address`` | as ``check_url`` says |
| ``events`` | ``invalid`` | not a non-empty list |
| ``events.N`` | ``unknown_event_type`` | not one of ``WEBHOOK_EVENT_TYPES`` |
| ``enabled`` | ``invalid`` | not ``true`` or ``false`` |

``check_url`` (``lab.lib.http``) is the rule every try is sent under, so an accepted URL can be
sent. Problems are listed unknown fields first, then ``url``, ``events`` and ``enabled``, as found.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError

from jobs.webhooks.events import WEBHOOK_EVENT_TYPES
from lab.errors import FieldError, LabError
from lab.lib.http import UnsafeURL, check_url

#: The fields of an endpoint a body may set, in the order problems are listed.
ENDPOINT_FIELDS = ("url", "events", "enabled")

_STRICT = ConfigDict(extra="forbid", strict=True)
_URL_MESSAGE = "Give the endpoint's URL."
_EVENTS_MESSAGE = "events must be a non-empty list of event types."
_EVENT_TYPE_MESSAGE = f"Unknown event type; choose from {', '.join(WEBHOOK_EVENT_TYPES)}."
_ENABLED_MESSAGE = "enabled must be true or false."
_UNKNOWN_FIELD_MESSAGE = f"Unknown field; allowed: {', '.join(ENDPOINT_FIELDS)}."


def _sendable_url(value: object, info: ValidationInfo) -> object:
    """Return the URL stripped of surrounding blanks once ``check_url`` accepts it.

    The validation context's ``allow_private`` (``LAB_WEBHOOK_ALLOW_PRIVATE``) lets loopback,
    private and shared addresses through, as it does when the URL is sent.
    """
    if value is None:
        raise PydanticCustomError("required", _URL_MESSAGE)
    if not isinstance(value, str) or not value.strip():
        raise PydanticCustomError("invalid_url", _URL_MESSAGE)
    url = value.strip()
    try:
        check_url(url, allow_private=bool((info.context or {}).get("allow_private")))
    except UnsafeURL as exc:
        message = exc.message
        if exc.code == "private_address":
            message += " Private and loopback addresses need LAB_WEBHOOK_ALLOW_PRIVATE."
        # Given as context, the message is never read as a template: braces in a URL stay as written.
        raise PydanticCustomError(exc.code, "{message}", {"message": message}) from None
    return url


def _not_null(value: object) -> object:
    """Refuse an explicit ``null``: a PATCH leaves out the fields it keeps."""
    if value is None:
        raise PydanticCustomError("null", "null is not a value of this field")
    return value


def _first_of_each(events: list[str]) -> list[str]:
    """Drop repeated event types, keeping the order of their first mention."""
    return list(dict.fromkeys(events))


EventType = Literal[WEBHOOK_EVENT_TYPES]
EventTypes = Annotated[list[EventType], Field(min_length=1), AfterValidator(_first_of_each)]


class EndpointCreate(BaseModel):
    """A new endpoint: its URL, the event types it receives (default: all), whether it is enabled."""

    model_config = _STRICT
    url: Annotated[str, BeforeValidator(_sendable_url)]
    events: EventTypes = Field(default_factory=lambda: list(WEBHOOK_EVENT_TYPES))
    enabled: StrictBool = True


class EndpointUpdate(BaseModel):
    """A change to an endpoint: the fields given change, the others stay (None: not given)."""

    model_config = _STRICT
    url: Annotated[str | None, BeforeValidator(_sendable_url)] = None
    events: Annotated[EventTypes | None, BeforeValidator(_not_null)] = None
    enabled: Annotated[StrictBool | None, BeforeValidator(_not_null)] = None

    def changes(self) -> dict[str, Any]:
        """Return the fields the body gave, by name, with their cleaned values."""
        return self.model_dump(exclude_unset=True)


_Body = TypeVar("_Body", EndpointCreate, EndpointUpdate)


def parse_endpoint_create(data: Any, *, allow_private: bool) -> EndpointCreate:
    """Validate a ``POST /webhook-endpoints`` body; ``allow_private`` as ``LAB_WEBHOOK_ALLOW_PRIVATE``.

    Raises LabError ``invalid_request`` listing every problem (see the module docstring).
    """
    return _parse(EndpointCreate, data, allow_private=allow_private)


def parse_endpoint_update(data: Any, *, allow_private: bool) -> EndpointUpdate:
    """Validate a ``PATCH /webhook-endpoints/{id}`` body; ``allow_private`` as ``LAB_WEBHOOK_ALLOW_PRIVATE``.

    Raises LabError ``invalid_request`` listing every problem (see the module docstring).
    """
    return _parse(EndpointUpdate, data, allow_private=allow_private)


def _parse(model: type[_Body], data: Any, *, allow_private: bool) -> _Body:
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    # Unknown keys are named here, before pydantic: a key need not be valid text (a lone
    # surrogate), and pydantic cannot say which key it could not read.
    problems = [
        FieldError(_printable(key), "unknown_field", _UNKNOWN_FIELD_MESSAGE)
        for key in data
        if key not in ENDPOINT_FIELDS
    ]
    known = {key: value for key, value in data.items() if key in ENDPOINT_FIELDS}
    try:
        body = model.model_validate(known, context={"allow_private": allow_private})
    except ValidationError as exc:
        problems.extend(_problem(error) for error in exc.errors(include_url=False))
    if problems:
        message = problems[0].message if len(problems) == 1 else f"{len(problems)} problems in the request."
        raise LabError("invalid_request", message, errors=problems)
    return body


def _problem(error: Any) -> FieldError:
    """Say one pydantic error in Lab's terms (the table in the module docstring)."""
    field, *rest = error["loc"]
    if field == "url" and error["type"] == "missing":
        return FieldError("url", "required", _URL_MESSAGE)
    if field == "events":
        if rest:
            return FieldError(f"events.{rest[0]}", "unknown_event_type", _EVENT_TYPE_MESSAGE)
        return FieldError("events", "invalid", _EVENTS_MESSAGE)
    if field == "enabled":
        return FieldError("enabled", "invalid", _ENABLED_MESSAGE)
    # The URL's own problems already carry Lab's code and message.
    return FieldError(field, error["type"], error["msg"])


def _printable(key: Any) -> str:
    """Return ``key`` cut to 100 characters with lone surrogates escaped, so the error body encodes."""
    return str(key)[:100].encode("utf-8", "backslashreplace").decode("utf-8")
