"""Job secrets: taken from a create body, kept encrypted, given only to the job's engine.

``POST /jobs`` (and ``/jobs/estimate``) may carry ``"secrets": {"NAME": "value"}`` beside the
spec's keys. Names are environment-variable names (``[A-Za-z_][A-Za-z0-9_]*``, not Lab's own
``LAB_*`` nor the few that steer the process: ``PATH``, ``PYTHONPATH``, ...); names and values
together are at most 64 KB of UTF-8. They are encrypted with Fernet (AES-128-CBC with an
HMAC-SHA256, the ``cryptography`` package) under ``settings.LAB_SECRETS_KEY`` (one or more
Fernet keys, comma-separated, the first encrypts: rotation by ``MultiFernet``), or, without it,
under a key derived from ``SECRET_KEY`` with HKDF-SHA256. Only the engine process of that job
receives them, as environment variables; the API, pages, events and webhooks never show them,
and log lines and error messages have every value of 4 characters or more replaced by ``***``.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from jobs.secrets.models import JobSecrets
from lab.errors import FieldError, LabError

#: Most bytes of names and values together (UTF-8), as Prime's secrets files.
MAX_SECRETS_BYTES = 64 * 1024
#: Most secrets per job.
MAX_SECRETS = 100
#: What a masked value reads as in log lines and messages.
MASK = "***"
#: Shorter values are not masked: they would blank ordinary words and numbers.
MIN_MASKED_LENGTH = 4

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Names that would steer the engine process instead of reaching the job's code.
_RESERVED_NAMES = frozenset({
    "PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUNBUFFERED", "LD_PRELOAD", "LD_LIBRARY_PATH",
    "HOME",
})
_RESERVED_PREFIX = "LAB_"
_DERIVATION_INFO = b"lab job secrets v1"


def _fernet() -> MultiFernet:
    """Return the cipher of job secrets (see the module docstring). Raises ImproperlyConfigured
    when ``LAB_SECRETS_KEY`` holds something that is not a Fernet key."""
    configured = [key.strip() for key in (settings.LAB_SECRETS_KEY or "").split(",") if key.strip()]
    if not configured:
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_DERIVATION_INFO).derive(
            settings.SECRET_KEY.encode()
        )
        configured = [base64.urlsafe_b64encode(derived).decode()]
    try:
        return MultiFernet([Fernet(key) for key in configured])
    except ValueError as exc:
        raise ImproperlyConfigured(f"LAB_SECRETS_KEY must be Fernet keys (32 url-safe base64 bytes): {exc}") from None


def _invalid(param: str, message: str) -> LabError:
    return LabError(
        "invalid_request", message, param=param, errors=[FieldError(param=param, code="invalid_value", message=message)]
    )


def split_secrets(data: Any) -> tuple[Any, dict[str, str]]:
    """Take the ``secrets`` member out of a create body.

    Returns ``(spec data without it, {name: value})`` (empty when absent or null); anything
    that is not a mapping comes back unchanged for the spec's own validation. Raises LabError
    400 ``invalid_request`` (``param`` ``secrets`` or ``secrets.NAME``) for a non-object, a
    name that is not an environment variable's or is reserved, a value that is not a string or
    holds NUL, more than :data:`MAX_SECRETS` names or more than :data:`MAX_SECRETS_BYTES` in all;
    the message never contains a value.
    """
    if not isinstance(data, Mapping) or "secrets" not in data:
        return data, {}
    spec_data = {key: value for key, value in data.items() if key != "secrets"}
    secrets = data["secrets"]
    if secrets is None:
        return spec_data, {}
    if not isinstance(secrets, Mapping):
        raise _invalid("secrets", 'secrets must be an object of {"NAME": "value"}')
    if len(secrets) > MAX_SECRETS:
        raise _invalid("secrets", f"at most {MAX_SECRETS} secrets per job")
    size = 0
    for name, value in secrets.items():
        shown = name[:64].encode("utf-8", "backslashreplace").decode() if isinstance(name, str) else "?"
        if not isinstance(name, str) or not _NAME.match(name):
            raise _invalid(f"secrets.{shown}", f"'{shown}' is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIX):
            raise _invalid(f"secrets.{name}", f"'{name}' is reserved: Lab sets it for the engine (names starting with "
                           f"{_RESERVED_PREFIX} and {', '.join(sorted(_RESERVED_NAMES))} are Lab's)")
        if not isinstance(value, str):
            raise _invalid(f"secrets.{name}", f"the value of '{name}' must be a string")
        if "\x00" in value:
            raise _invalid(f"secrets.{name}", f"the value of '{name}' holds a NUL character, which no environment variable can")
        try:
            size += len(name) + len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise _invalid(f"secrets.{name}", f"the value of '{name}' is not valid Unicode text") from None
    if size > MAX_SECRETS_BYTES:
        raise _invalid("secrets", f"the secrets are {size} bytes; the limit is {MAX_SECRETS_BYTES}")
    return spec_data, dict(secrets)


def secrets_store(*, job, secrets: Mapping[str, str]) -> JobSecrets | None:
    """Encrypt and store ``secrets`` for ``job`` (inside the caller's transaction); nothing for none."""
    if not secrets:
        return None
    token = _fernet().encrypt(json.dumps(dict(secrets), ensure_ascii=False).encode("utf-8"))
    return JobSecrets.objects.create(job=job, names=sorted(secrets), ciphertext=token)


def engine_secrets(*, job_id: str) -> dict[str, str]:
    """Return the decrypted secrets of the job ``job_id`` (its public id; ``{}`` when it has none),
    for its engine process only. Raises ImproperlyConfigured when the key cannot decrypt them
    (``LAB_SECRETS_KEY`` changed without keeping the old key)."""
    row = JobSecrets.objects.unscoped().filter(job__public_id=job_id).first()
    if row is None:
        return {}
    try:
        return json.loads(_fernet().decrypt(bytes(row.ciphertext)))
    except InvalidToken:
        raise ImproperlyConfigured(
            "a job's secrets cannot be decrypted: LAB_SECRETS_KEY must keep the key they were stored with"
        ) from None


def masker(*, job_id: str):
    """Return a function that replaces every secret value of the job (≥ 4 characters) in a text
    with ``***``; the identity for a job without secrets."""
    values = sorted(
        (value for value in engine_secrets(job_id=job_id).values() if len(value) >= MIN_MASKED_LENGTH),
        key=len, reverse=True,
    )
    if not values:
        return lambda text: text
    pattern = re.compile("|".join(re.escape(value) for value in values))
    return lambda text: pattern.sub(MASK, text) if text else text


def mask_lines(*, job_id: str, lines: Iterable[tuple[Any, Any, str, str]]) -> list[tuple[Any, Any, str, str]]:
    """Mask the line text of ``(seq, time, stream, line)`` tuples (see :func:`masker`)."""
    mask = masker(job_id=job_id)
    return [(seq, time, stream, mask(line)) for seq, time, stream, line in lines]
