"""Public ids (lab.ids.public_id): the prefix, then base-36 characters drawn uniformly."""

from __future__ import annotations

import re
from collections import Counter

from lab.ids import public_id


def test_it_writes_the_prefix_and_the_asked_number_of_base36_characters():
    assert re.fullmatch(r"usage_[0-9a-z]{20}", public_id("usage"))
    assert re.fullmatch(r"job_[0-9a-z]{7}", public_id("job", length=7))


def test_every_character_is_drawn_at_every_position():
    ids = [public_id("x", length=4) for _ in range(5000)]
    assert len(set(ids)) > 4900  # 36**4 = 1,679,616 possible
    for position in range(2, 6):
        # each of the 36 characters: 5000 / 36 = 139 expected at each position
        assert set(Counter(value[position] for value in ids)) == set("0123456789abcdefghijklmnopqrstuvwxyz")
