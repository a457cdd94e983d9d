"""Opaque, prefixed public ids (``job_...``, ``ckpt_...``, ``evt_...``) and API key material."""

from __future__ import annotations

import hashlib
import secrets

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def public_id(prefix: str, length: int = 20) -> str:
    """Return ``<prefix>_<length random base-36 characters>`` (about 103 bits for 20 characters).

    One uniform draw below 36**length written in base 36: the same ids as a choice per character,
    from one read of the system's randomness instead of one per character (the usage ledger makes
    thousands a second).
    """
    value = secrets.randbelow(len(_ALPHABET) ** length)
    characters = []
    for _ in range(length):
        value, digit = divmod(value, len(_ALPHABET))
        characters.append(_ALPHABET[digit])
    return f"{prefix}_" + "".join(characters)


def sha256_hex(value: str) -> str:
    """Return the hex SHA-256 of ``value`` encoded as UTF-8."""
    return hashlib.sha256(value.encode()).hexdigest()
