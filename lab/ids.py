"""Opaque, prefixed public ids (``job_...``, ``ckpt_...``, ``evt_...``) and API key material."""

from __future__ import annotations

import hashlib
import secrets

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def public_id(prefix: str, length: int = 20) -> str:
    """Return ``<prefix>_<length random base-36 characters>`` (about 103 bits for 20 characters)."""
    return f"{prefix}_" + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def sha256_hex(value: str) -> str:
    """Return the hex SHA-256 of ``value`` encoded as UTF-8."""
    return hashlib.sha256(value.encode()).hexdigest()
