"""Typed readers for settings that come from the environment.

Each helper reads one variable, falls back to a default when it is unset or empty, and raises
``ImproperlyConfigured`` with the variable's name when the value cannot be parsed, so a typo in a
deployment fails at start-up instead of at the first request. Secrets may instead be given as a
file path in ``<NAME>_FILE`` (Kubernetes secret mounts); the file's content, stripped, is used.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_raw(name: str) -> str | None:
    """Return the raw value of ``name`` (or the content of the file named by ``name_FILE``).

    Returns None when neither is set or the value is empty.
    Raises ImproperlyConfigured when ``name_FILE`` names a file that cannot be read.
    """
    value = os.environ.get(name)
    if value:
        return value
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip() or None
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    return None


def env_str(name: str, default: str | None = None) -> str | None:
    """Return ``name`` as a string, or ``default``."""
    value = env_raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    """Return ``name`` as a boolean (1/0, true/false, yes/no, on/off; case-insensitive)."""
    value = env_raw(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``name`` as an integer within [minimum, maximum] when those are given."""
    value = env_raw(name)
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum {minimum}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum {maximum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    """Return ``name`` as a comma-separated list of non-empty, stripped strings."""
    value = env_raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_int_list(name: str, default: list[int]) -> list[int]:
    """Return ``name`` as a comma-separated list of non-negative integers."""
    items = env_list(name, [str(item) for item in default])
    try:
        numbers = [int(item) for item in items]
    except ValueError:
        raise ImproperlyConfigured(f"{name}={env_raw(name)!r} is not a comma-separated list of integers") from None
    if not numbers or any(number < 0 for number in numbers):
        raise ImproperlyConfigured(f"{name} must list at least one non-negative integer")
    return numbers


def env_json(name: str, default: Any) -> Any:
    """Return ``name`` parsed as JSON, or ``default``."""
    value = env_raw(name)
    if value is None:
        return default
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{name} is not valid JSON: {exc}") from None


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """Return ``name`` when it is one of ``choices``."""
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def env_decimal(name: str, default: str, *, minimum: Decimal | None = None) -> Decimal:
    """Return ``name`` as a finite decimal number (money in USD, e.g. ``"10.00"``), at least ``minimum``."""
    value = env_str(name, default)
    try:
        number = Decimal(value.strip())
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name}={value!r} is not a decimal number") from None
    if not number.is_finite():
        raise ImproperlyConfigured(f"{name}={value!r} is not a finite number")
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum {minimum}")
    return number
