"""Formats shared by every response body (docs/api.md "Conventions"); they live in ``lab.formats``,
where webhook payloads and presenters read them too."""

from __future__ import annotations

from lab.formats import iso, money

__all__ = ["iso", "money"]
