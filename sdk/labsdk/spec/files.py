"""Spec text and files: TOML or JSON decoded into plain data (size, encoding, syntax and
duplicate keys checked), then validated."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from labsdk.spec.parse import ParsedSpec, parse_spec
from labsdk.spec.problems import SpecError, SpecProblem

#: Largest spec file or body accepted, in bytes (the REST API refuses bodies over 1 MB).
MAX_SPEC_BYTES = 1024 * 1024


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def decode_spec(text: str | bytes, format: Literal["toml", "json"]) -> Any:
    """Decode spec text (TOML or JSON) into plain data without validating it.

    ``text`` may be bytes (must be UTF-8) or str; at most :data:`MAX_SPEC_BYTES`.
    Raises :class:`SpecError` (``param`` ``""``) for oversized, undecodable, malformed or
    duplicate-key input; never another exception for bad input.
    """
    if format not in ("toml", "json"):
        raise ValueError(f"format must be 'toml' or 'json', not {format!r}")
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise SpecError([SpecProblem(
            "", "too_large", f"the spec is {size} bytes; the limit is {MAX_SPEC_BYTES}"
        )])
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError([SpecProblem(
                "", "invalid_encoding",
                f"the spec is not UTF-8 text (bad byte at offset {exc.start})",
            )]) from None
    return _decode_toml(text) if format == "toml" else _decode_json(text)


def loads_spec(text: str | bytes, format: Literal["toml", "json"]) -> ParsedSpec:
    """Decode a spec from TOML or JSON text (:func:`decode_spec`) and validate it
    (:func:`parse_spec`). Raises :class:`SpecError` listing the problems."""
    return parse_spec(decode_spec(text, format))


def _decode_toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        code = "duplicate_key" if message.startswith(("Cannot overwrite", "Cannot declare")) \
            else "invalid_syntax"
        raise SpecError([SpecProblem("", code, f"invalid TOML: {message}")]) from None
    except RecursionError:
        raise SpecError([SpecProblem(
            "", "too_deep", "invalid TOML: nested too deeply to read"
        )]) from None


def _decode_json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as exc:
        raise SpecError([SpecProblem(
            "", "duplicate_key", f"invalid JSON: key '{exc.key}' appears twice in one object"
        )]) from None
    except json.JSONDecodeError as exc:
        raise SpecError([SpecProblem("", "invalid_syntax", f"invalid JSON: {exc}")]) from None
    except RecursionError:
        raise SpecError([SpecProblem(
            "", "too_deep", "invalid JSON: nested too deeply to read"
        )]) from None
    except ValueError:  # an integer with more digits than Python converts (4,300)
        raise SpecError([SpecProblem(
            "", "out_of_range", "invalid JSON: an integer has too many digits"
        )]) from None


def read_spec_file(path: str | Path) -> Any:
    """Read a spec file into plain data without validating it: ``.json`` as JSON,
    anything else as TOML. Raises :class:`SpecError` as :func:`decode_spec` does, and
    ``OSError`` when the file cannot be read."""
    path = Path(path)
    with path.open("rb") as handle:
        raw = handle.read(MAX_SPEC_BYTES + 1)
    return decode_spec(raw, "json" if path.suffix.lower() == ".json" else "toml")


def load_spec_file(path: str | Path) -> ParsedSpec:
    """Read and validate a spec file (:func:`read_spec_file`, then :func:`parse_spec`).

    Raises :class:`SpecError` listing the problems, ``OSError`` when unreadable.
    """
    return parse_spec(read_spec_file(path))
