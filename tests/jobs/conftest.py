"""Fixtures for job tests: a minimal valid spec on the tiny model."""

from __future__ import annotations

import copy

import pytest

TINY_SPEC = {
    "name": "addition-tiny",
    "model": "lab/tiny-random-llama",
    "max_steps": 3,
    "batch_size": 8,
    "rollouts_per_example": 4,
    "sampling": {"max_tokens": 8},
    "env": [{"id": "lab/addition", "args": {"max_operand": 9}}],
    "metadata": {"team": "research"},
}


@pytest.fixture
def spec() -> dict:
    """A fresh copy of a small valid spec."""
    return copy.deepcopy(TINY_SPEC)
