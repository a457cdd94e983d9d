"""Template filters that show values the way the SDK and the CLI do (``labsdk.display``)."""

from __future__ import annotations

from django import template
from labsdk.display import format_bytes

register = template.Library()


@register.filter
def size(value: int | None) -> str:
    """Return a byte count in decimal SI units (``62.6 MB``), the unit of ``lab checkpoints
    list`` and the SDK; ``""`` for ``None``."""
    return format_bytes(value)
