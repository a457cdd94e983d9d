"""Validating a decoded spec: :func:`parse_spec` gives a :class:`ParsedSpec` with warnings,
or raises :class:`SpecError` listing every problem at once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from labsdk.spec.layouts import translate_with_sources
from labsdk.spec.model import JobSpec, _cross_field_problems
from labsdk.spec.problems import SpecError, SpecProblem
from labsdk.spec.translate import _problem_from_pydantic
from labsdk.spec.values import SPEC_MAX_DEPTH, nesting_depth_path
from labsdk.spec.warnings import spec_warnings


@dataclass(frozen=True)
class ParsedSpec:
    """A valid spec with the warnings found while parsing it."""

    spec: JobSpec
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the canonical JSON-able dict: every Lab key with its default filled in,
        plus the optional keys that were given (absent ones are left out). Prime's other
        names are resolved: ``checkpoint_id`` is stored as ``init_from``,
        ``checkpoints.keep_cloud`` as ``checkpoints.keep_last``, ``eval.eval_base_model`` as
        ``eval.skip_first_step``. Parsing the canonical dict gives it back unchanged."""
        return self.spec.model_dump(mode="json")


def parse_spec(data: Mapping[str, Any]) -> ParsedSpec:
    """Validate a spec given as a mapping (decoded JSON or TOML).

    Lab's layout, prime-rl's native layout and the older prime CLI form are accepted; the
    other two are translated first (:mod:`labsdk.spec.layouts`). Returns the
    :class:`ParsedSpec`; its warnings name every key that was given but that Lab does not
    act on (:mod:`labsdk.spec.warnings`). Raises :class:`SpecError` listing every problem at
    once: field errors, unknown keys and cross-field rules together; a spec nested deeper than
    :data:`~labsdk.spec.values.SPEC_MAX_DEPTH` levels is refused first, as a ``too_deep``
    problem of the top-level key that holds the deep part, before anything else reads it. Catalogue checks
    (model, environments, context length) are separate: :func:`catalog_problems`.
    """
    if not isinstance(data, Mapping):
        raise SpecError([SpecProblem(
            "", "invalid_type", f"a spec must be a JSON object, not {type(data).__name__}"
        )])
    too_deep = nesting_depth_path(data, SPEC_MAX_DEPTH)
    if too_deep is not None:
        raise SpecError([SpecProblem(
            too_deep[0], "too_deep", f"nested deeper than the {SPEC_MAX_DEPTH} levels of tables and arrays a spec may have"
        )])
    data, layout_warnings, sources = translate_with_sources(_integral_numbers_as_ints(data))
    problems: list[SpecProblem] = []
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        spec = None
        problems = [_problem_from_pydantic(e) for e in exc.errors(include_url=False)]
    if spec is None:
        bad_params = {problem.param for problem in problems}
        for problem in _cross_field_problems(data, bad_params):
            if problem not in problems:
                problems.append(problem)
        raise SpecError([_named_as_given(problem, sources) for problem in problems])
    return ParsedSpec(spec=spec, warnings=layout_warnings + spec_warnings(data, spec))


#: Tables whose contents Lab passes on as given, so their numbers keep their JSON type.
_FREE_FORM = frozenset({"args", "extra_body", "run_config", "wandb", "infrastructure", "tailscale", "metadata"})


def _integral_numbers_as_ints(value: Any, key: str = "") -> Any:
    """Return ``value`` with every float that is a whole number (``20.0``) as an int, outside the
    free-form tables. JSON does not tell 20.0 from 20 (RFC 8259 §6) and the JSON Schema's
    ``integer`` accepts both, while the model's integer fields take ints only; float fields
    take ints too, so nothing else changes meaning."""
    if key in _FREE_FORM:
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {name: _integral_numbers_as_ints(item, name) for name, item in value.items()}
    if isinstance(value, list):
        return [_integral_numbers_as_ints(item) for item in value]
    return value


def _named_as_given(problem: SpecProblem, sources: Mapping[str, str]) -> SpecProblem:
    """Say which key of the submitted layout a problem of a translated Lab key came from."""
    parts = problem.param.split(".")
    for length in range(len(parts), 0, -1):
        source = sources.get(".".join(parts[:length]))
        if source is not None:
            # an environment block is reshaped by the translation: name the block, not a key inside it
            index = parts[length:length + 1]
            given = ".".join([source, *index]) if parts[0] == "env" and index and index[0].isdigit() else source
            return SpecProblem(problem.param, problem.code, f"{problem.message} (given as '{given}')")
    return problem
