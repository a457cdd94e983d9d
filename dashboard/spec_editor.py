"""The "New job" editor: example specs to start from, and where a spec problem sits in the text.

The editor is one text area holding a TOML or JSON spec. Validation errors carry dotted ``param``
paths (``sampling.max_tokens``, ``env.0.id``); :func:`param_line` finds the line that holds that
field so the page can show each error next to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

EXAMPLES_DIR = Path(settings.BASE_DIR) / "examples"
DEFAULT_EXAMPLE = "addition-tiny"

# No two quantifiers here can match the same characters, so a hostile line (``[a`` and a million
# spaces) is matched in linear time; the table name's characters are checked separately.
_TOML_TABLE = re.compile(r"^\s*(\[\[?)([^\[\]#]*)\]\]?\s*(#.*)?$")
_TOML_TABLE_NAME = re.compile(r"[A-Za-z0-9_.\-\"' ]+")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_\-]+|\"[^\"]*\")\s*=")


@dataclass(frozen=True)
class Example:
    """An example spec shipped in ``examples/``: its name (file stem), first comment line and text."""

    name: str
    summary: str
    text: str


def examples() -> list[Example]:
    """Return the example specs in ``examples/`` (``*.toml``), the default one first."""
    found = []
    for path in sorted(EXAMPLES_DIR.glob("*.toml")):
        text = path.read_text(encoding="utf-8")
        first = text.splitlines()[0] if text else ""
        summary = first.lstrip("# ").strip() if first.startswith("#") else ""
        found.append(Example(name=path.stem, summary=summary, text=text))
    found.sort(key=lambda example: example.name != DEFAULT_EXAMPLE)
    return found


def example_named(name: str | None) -> Example | None:
    """Return the example called ``name`` (a file stem from :func:`examples`), the default one for
    None or an unknown name, or None when there are no examples at all."""
    every = examples()
    return next((example for example in every if example.name == name), every[0] if every else None)


_TOML_MODEL_LINE = re.compile(r'^model = "[^"\n]*"', re.M)


def with_model(text: str, model_id: str) -> str:
    """Return the example spec ``text`` with its top-level ``model = "..."`` line naming
    ``model_id`` (a model the organization may use, checked by the caller)."""
    return _TOML_MODEL_LINE.sub(lambda _: f'model = "{model_id}"', text, count=1)


@lru_cache(maxsize=4)
def _toml_key_paths(text: str) -> tuple[tuple[str, int], ...]:
    """Return ``(dotted path, line number)`` for every table header and ``key =`` line of ``text``.

    Arrays of tables count their members, so the second ``[[env]]`` is ``env.1``. A best effort
    for pointing at lines: it does not need (or try) to parse TOML fully.
    """
    paths: list[tuple[str, int]] = []
    table = ""
    array_counts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _TOML_TABLE.match(line)
        if header and not _TOML_TABLE_NAME.fullmatch(header.group(2).strip()):
            header = None
        if header:
            name = ".".join(part.strip().strip("\"'") for part in header.group(2).split("."))
            if header.group(1) == "[[":
                index = array_counts.get(name, -1) + 1
                array_counts[name] = index
                table = f"{name}.{index}"
            else:
                table = _with_array_indexes(name, array_counts)
            paths.append((table, number))
            continue
        key = _TOML_KEY.match(line)
        if key:
            name = key.group(1).strip('"')
            paths.append((f"{table}.{name}" if table else name, number))
    return tuple(paths)


def _with_array_indexes(name: str, array_counts: dict[str, int]) -> str:
    """Turn ``env.args`` into ``env.0.args`` when ``env`` is an array of tables (its latest member)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in array_counts:
            return f"{prefix}.{array_counts[prefix]}." + ".".join(parts[cut:])
    return name


def _json_line(text: str, param: str) -> int | None:
    """Find the line of ``param`` in JSON text by looking for each named key in turn."""
    position, found = 0, None
    for part in param.split("."):
        if part.isdigit():
            continue
        index = text.find(f'"{part}"', position)
        if index < 0:
            break
        position, found = index + len(part) + 2, index
    return None if found is None else text.count("\n", 0, found) + 1


def param_line(text: str, format: str, param: str | None) -> int | None:
    """Return the 1-based line of ``text`` that holds the field ``param`` (a dotted path), or None.

    For a field that is not written in the text (a missing required key), the line of the
    closest enclosing table is returned; for a spec-wide problem (``param`` empty), None.
    """
    if not param:
        return None
    if format == "json":
        return _json_line(text, param)
    best, best_length = None, -1
    for path, number in _toml_key_paths(text):
        if (param == path or param.startswith(path + ".")) and len(path) > best_length:
            best, best_length = number, len(path)
    return best
