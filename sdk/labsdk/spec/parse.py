"""Validating a decoded spec: :func:`parse_spec` gives a :class:`ParsedSpec` with warnings,
or raises :class:`SpecError` listing every problem at once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from labsdk.spec.model import PRIME_UNUSED_KEYS, JobSpec, _cross_field_problems
from labsdk.spec.problems import SpecError, SpecProblem
from labsdk.spec.translate import _problem_from_pydantic


@dataclass(frozen=True)
class ParsedSpec:
    """A valid spec with the warnings found while parsing it."""

    spec: JobSpec
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the canonical JSON-able dict: every Lab key with its default filled in,
        plus the Prime Intellect keys that were given (absent ones are left out)."""
        data = self.spec.model_dump(mode="json")
        for path in PRIME_UNUSED_KEYS:
            *parents, key = path.split(".")
            holder = data
            for part in parents:
                holder = holder[part]
            if holder.get(key) is None:
                holder.pop(key, None)
        return data


def parse_spec(data: Mapping[str, Any]) -> ParsedSpec:
    """Validate a spec given as a mapping (decoded JSON or TOML).

    Returns the :class:`ParsedSpec`; warnings name the Prime Intellect keys that were
    stored but are not used. Raises :class:`SpecError` listing every problem at once:
    field errors, unknown keys and cross-field rules together. Catalogue checks (model,
    environments, context length) are separate: :func:`catalog_problems`.
    """
    if not isinstance(data, Mapping):
        raise SpecError([SpecProblem(
            "", "invalid_type", f"a spec must be a JSON object, not {type(data).__name__}"
        )])
    problems: list[SpecProblem] = []
    try:
        spec = JobSpec.model_validate(dict(data))
    except ValidationError as exc:
        spec = None
        problems = [_problem_from_pydantic(e) for e in exc.errors(include_url=False)]
    if spec is None:
        bad_params = {problem.param for problem in problems}
        for problem in _cross_field_problems(data, bad_params):
            if problem not in problems:
                problems.append(problem)
        raise SpecError(problems)

    warnings = []
    for path in PRIME_UNUSED_KEYS:
        *parents, key = path.split(".")
        holder: Any = data
        for part in parents:
            holder = holder.get(part) if isinstance(holder, Mapping) else None
        if isinstance(holder, Mapping) and key in holder:
            warnings.append(
                f"'{path}' is a Prime Intellect setting that Lab does not use; "
                "it is stored and ignored"
            )
    return ParsedSpec(spec=spec, warnings=warnings)
