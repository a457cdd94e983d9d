"""Spec keys that name job secrets, checked against the secrets a job is given.

A job's secrets travel beside its spec (``secrets`` in the create body; the CLI reads them from
``-e``, ``--env-file`` and the spec's ``env_files``); the spec only names them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from labsdk.spec.model import JobSpec
from labsdk.spec.problems import SpecProblem


def secret_names_used(spec: JobSpec) -> list[tuple[str, str]]:
    """Return ``(param, secret name)`` for every secret the spec's endpoints need: the teacher's,
    ``teacher.client.api_key_var`` (``PRIME_API_KEY`` for a ``[teacher]`` without a client) and
    the values of ``teacher.client.headers_from_env``; an evaluation endpoint's
    ``eval.endpoint.api_key_var``; each ``[[env]] judge``'s ``api_key_var``."""
    evaluated = [("eval.endpoint.api_key_var", spec.eval.endpoint.api_key_var)] if spec.eval.endpoint else []
    for section, blocks in (("env", spec.env), ("eval.env", spec.eval.env or [])):
        evaluated += [
            (f"{section}.{index}.judge.api_key_var", env.judge.api_key_var)
            for index, env in enumerate(blocks) if env.judge and env.judge.api_key_var
        ]
    if spec.teacher is None or spec.loss != "sft":
        return evaluated
    endpoint = spec.teacher.endpoint()
    # Without [teacher.client] the teacher is Prime Inference, whose key is the secret PRIME_API_KEY.
    used = [("teacher.client.api_key_var" if spec.teacher.client else "teacher", endpoint.api_key_var)]
    used += [(f"teacher.client.headers_from_env.{header}", name) for header, name in endpoint.headers_from_env.items()]
    return used + evaluated


def secret_problems(spec: JobSpec, names: Collection[str] | Mapping[str, str]) -> list[SpecProblem]:
    """Return a ``missing_secret`` problem for each secret the spec names that is not in ``names``.

    Given the secrets themselves (a mapping of name to value), also return an ``invalid_secret``
    problem for each one the teacher sends as an HTTP header whose value cannot be sent (a line
    break, NUL, another control or a non-ASCII character: RFC 9110 section 5.5); the message
    never holds the value."""
    given = ", ".join(sorted(names)) or "none"
    problems = []
    for param, name in secret_names_used(spec):
        if name not in names:
            problems.append(SpecProblem(
                param, "missing_secret", f"'{name}' is not among the job's secrets (given: {given}); "
                f"pass it with -e {name}=... or an env file, or as secrets.{name} in the request",
            ))
        elif isinstance(names, Mapping) and not header_value_sendable(str(names[name])):
            problems.append(SpecProblem(
                param, "invalid_secret", f"the secret '{name}' is sent as an HTTP header and cannot be: it holds "
                "a line break, NUL, another control character or a non-ASCII character",
            ))
    return problems


def header_value_sendable(value: str) -> bool:
    """Whether ``value`` can be sent as an HTTP header field value: visible ASCII, spaces and tabs."""
    return all(character == "\t" or " " <= character <= "~" for character in value)
