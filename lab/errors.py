"""Lab's one domain error: what services, selectors and the run pipeline of every app raise when
they refuse something.

A :class:`LabError` names a stable ``code`` from docs/api.md ("Conventions": ``invalid_request``,
``not_found``, ``invalid_state``, ...), a message for people, the first bad field as a dotted
path (``param``: ``env.0.id``) and every field problem found (``errors``). It says nothing about
HTTP: the API turns codes into statuses and the error body in one place
(``lab.api.errors``), the dashboard shows the message on its pages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FieldError:
    """One problem with one field: ``param`` is a dotted path, ``code`` a stable identifier."""

    param: str | None
    code: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON shape used in ``error.errors``."""
        return {"param": self.param, "code": self.code, "message": self.message}


class LabError(Exception):
    """A refusal with a ``code`` from docs/api.md, a ``message`` and the fields it concerns.

    ``errors`` lists every field problem; ``param`` defaults to the first of them.
    ``retry_after_s`` says when the same request may succeed (seconds; the API sends it as
    ``Retry-After``), or is None.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        errors: Iterable[FieldError] = (),
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.errors = list(errors)
        self.param = param if param is not None or not self.errors else self.errors[0].param
        self.retry_after_s = retry_after_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, param={self.param!r})"


def not_found(what: str = "object") -> LabError:
    """Return the ``not_found`` error used for missing objects and other tenants' objects alike."""
    return LabError("not_found", f"No such {what}.")


def invalid(message: str, *, param: str | None = None) -> LabError:
    """Return the ``invalid_request`` error for bad input: of the field ``param`` (a dotted path),
    or of the request as a whole when ``param`` is None."""
    errors = [FieldError(param=param, code="invalid", message=message)] if param else []
    return LabError("invalid_request", message, errors=errors)


def permission_denied(message: str) -> LabError:
    """Return the ``permission_denied`` error for an actor whose role does not allow the action."""
    return LabError("permission_denied", message)
