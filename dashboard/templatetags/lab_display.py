"""Template filters that show values the way the SDK and the CLI do (``labsdk.display``)."""

from __future__ import annotations

import json

from django import template
from labsdk.display import format_bytes

register = template.Library()


@register.filter
def size(value: int | None) -> str:
    """Return a byte count in decimal SI units (``62.6 MB``), the unit of ``lab checkpoints
    list`` and the SDK; ``""`` for ``None``."""
    return format_bytes(value)


@register.filter
def pretty_json(text: str | bytes | None) -> str:
    """Return a JSON document indented by two spaces with its keys in their sent order, so that a
    webhook body or a receiver's answer reads as a tree; text that is not JSON comes back as it was."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


@register.filter
def duration(seconds: float | None) -> str:
    """Return seconds as a short duration: ``45 s``, ``3 min``, ``1 h 5 min``; ``""`` for None."""
    if seconds is None:
        return ""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
