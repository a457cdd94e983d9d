"""How a refused spec is reported: :class:`SpecProblem` rows gathered in a :class:`SpecError`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecProblem:
    """One problem found in a spec.

    ``param`` is the dotted path of the bad field with list indexes as numbers
    (``env.0.id``; ``""`` for the file as a whole), ``code`` one of :data:`VOCABULARY`,
    ``message`` a sentence for people.
    """

    param: str
    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """Return the problem as the API's ``{"param", "code", "message"}`` object."""
        return {"param": self.param, "code": self.code, "message": self.message}


class SpecError(Exception):
    """A spec was refused; ``errors`` lists every problem found: field problems in the
    spec's field order, then cross-field rules."""

    def __init__(self, errors: list[SpecProblem]):
        self.errors = errors
        super().__init__("; ".join(f"{e.param or '<spec>'}: {e.message}" for e in errors))

    @property
    def param(self) -> str:
        """The dotted path of the first problem (the API error's ``param``)."""
        return self.errors[0].param if self.errors else ""


#: Every code a problem may carry (the table in :mod:`labsdk.spec` says what each means).
VOCABULARY = frozenset({
    "required", "invalid_type", "invalid_value", "out_of_range", "too_long", "too_short",
    "too_deep", "unknown_key", "not_divisible", "unknown_model", "unknown_environment",
    "invalid_encoding", "invalid_syntax", "duplicate_key", "too_large", "conflicting_keys",
    "missing_secret",
})
