"""Spec keys that name job secrets, checked against the secrets a job is given.

A job's secrets travel beside its spec (``secrets`` in the create body; the CLI reads them from
``-e``, ``--env-file`` and the spec's ``env_files``); the spec only names them.
"""

from __future__ import annotations

from collections.abc import Collection

from labsdk.spec.model import JobSpec
from labsdk.spec.problems import SpecProblem


def secret_names_used(spec: JobSpec) -> list[tuple[str, str]]:
    """Return ``(param, secret name)`` for every secret the spec's teacher needs:
    ``teacher.client.api_key_var`` (``PRIME_API_KEY`` for a ``[teacher]`` without a client) and
    the values of ``teacher.client.headers_from_env``."""
    if spec.teacher is None or spec.loss != "sft":
        return []
    endpoint = spec.teacher.endpoint()
    # Without [teacher.client] the teacher is Prime Inference, whose key is the secret PRIME_API_KEY.
    used = [("teacher.client.api_key_var" if spec.teacher.client else "teacher", endpoint.api_key_var)]
    used += [(f"teacher.client.headers_from_env.{header}", name) for header, name in endpoint.headers_from_env.items()]
    return used


def secret_problems(spec: JobSpec, names: Collection[str]) -> list[SpecProblem]:
    """Return a ``missing_secret`` problem for each secret the spec names that is not in ``names``."""
    given = ", ".join(sorted(names)) or "none"
    return [
        SpecProblem(param, "missing_secret", f"'{name}' is not among the job's secrets (given: {given}); "
                    f"pass it with -e {name}=... or an env file, or as secrets.{name} in the request")
        for param, name in secret_names_used(spec)
        if name not in names
    ]
