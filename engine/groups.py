"""GRPO groups of a step's batch: how many rollouts each group holds, and which rows are whose.

A batch holds its rollouts row by row, the rollouts of one group (one example, one prompt)
adjacent. Every group of an `[[env]]` block holds that block's `group_size` rollouts (the
spec's `rollouts_per_example` when the block sets none), so blocks of different group sizes
make a batch whose groups differ in size. The consumers (advantages, filters, packing, the
trainer's metrics) take the sizes as one int when every group has it, the fast path of a
fixed K, else one int per group; `uniform_size` turns a list into that int when it can.

Which groups make a step is `step_groups`: groups are drawn one by one over the run
(`environment_index`, by `[[env]] ratio`, else in turn) until the step's rollouts reach
`batch_size`; a drawn group that would pass it is drawn again among the blocks whose groups
still fit (by ratio, seeded by the group's index; in turn, the next block that fits), so
every step holds exactly `batch_size` rollouts. The spec makes sure one always fits
(labsdk.spec: `batch_size` is a multiple of every group size, and every group size a
multiple of the smallest). With one group size throughout, nothing is ever drawn again and
step s takes the groups (s − 1)·G … s·G − 1, G = batch_size / K, as it always has.
"""

from __future__ import annotations

import random
from typing import Sequence


def training_group_sizes(spec) -> list[int]:
    """Return the rollouts per example of each training `[[env]]` block: its `group_size`,
    else the spec's `rollouts_per_example`."""
    return [getattr(block, "group_size", None) or spec.rollouts_per_example for block in spec.env]


def training_ratios(spec) -> list[float] | None:
    """Return each training block's `[[env]] ratio` (1 where a block gives none), or None when
    no block gives one (the blocks then take turns)."""
    return [block.ratio or 1.0 for block in spec.env] if any(block.ratio for block in spec.env) else None


def uniform_size(sizes: int | Sequence[int]) -> int | None:
    """Return the one group size of `sizes` (an int, or one per group), or None when the
    groups differ (or there are none)."""
    if isinstance(sizes, int):
        return sizes
    distinct = set(sizes)
    return next(iter(distinct)) if len(distinct) == 1 else None


def group_sizes_list(sizes: int | Sequence[int], rows: int) -> list[int]:
    """Return one size per group for `rows` rollouts whose groups have `sizes` (an int for
    all, or one per group). Raises ValueError when the sizes do not cover exactly `rows`."""
    if isinstance(sizes, int):
        if sizes < 1 or rows % sizes:
            raise ValueError(f"{rows} rollouts do not make whole groups of {sizes}")
        return [sizes] * (rows // sizes)
    sizes = [int(size) for size in sizes]
    if any(size < 1 for size in sizes) or sum(sizes) != rows:
        raise ValueError(f"groups of {sizes} rollouts do not make the batch's {rows}")
    return sizes


def group_starts(sizes: Sequence[int]) -> list[int]:
    """Return the first row of each group (groups of `sizes` rollouts, adjacent), and the
    total number of rows last: len(sizes) + 1 numbers."""
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    return starts


def row_groups(sizes: Sequence[int]) -> list[int]:
    """Return the group of every row (groups of `sizes` rollouts, adjacent)."""
    return [group for group, size in enumerate(sizes) for _ in range(size)]


def environment_index(index: int, ratios: list[float] | None, *, count: int, seed: int) -> int:
    """Return which of the `count` training environments the `index`-th group of the run
    (counted over all steps) samples from: round-robin when `ratios` is None, else (one ratio
    per environment, from `[[env]] ratio`, 1 where a block gives none) drawn with probability
    ratio / sum(ratios), as prime-rl mixes its environments. The draw is seeded by `seed` and
    `index` alone, so a resumed run draws exactly what an uninterrupted one does."""
    if ratios is None:
        return index % count
    return random.Random(f"lab-env-mix:{seed}:{index}").choices(range(count), weights=ratios)[0]


def fitting_environment_index(index: int, room: int, sizes: Sequence[int], ratios: list[float] | None, *, seed: int) -> int:
    """Return the environment of the `index`-th group of the run when at most `room` rollouts
    fit in its step: the one `environment_index` draws when its group fits, else one of the
    environments whose groups fit, drawn by their ratios (seeded by `seed` and `index`), or
    without ratios the next one in turn that fits. Raises ValueError when none fits."""
    first = environment_index(index, ratios, count=len(sizes), seed=seed)
    if sizes[first] <= room:
        return first
    fitting = [env for env in range(len(sizes)) if sizes[env] <= room]
    if not fitting:
        raise ValueError(f"no environment's group fits the {room} rollouts left in the batch")
    if ratios is None:
        return next(env for env in [*range(first + 1, len(sizes)), *range(first)] if sizes[env] <= room)
    return random.Random(f"lab-env-fit:{seed}:{index}").choices(fitting, weights=[ratios[env] for env in fitting])[0]


class GroupSchedule:
    """Which groups each step of a run samples: `step_groups(step)` gives (index of the group
    over the run, environment index) for every group of `step`, in batch order.

    `sizes`: rollouts per group of each environment; `batch_size`: rollouts per step;
    `ratios`: `[[env]] ratio` per environment, or None (in turn). A function of these and
    `seed` alone, so a resumed run samples what an uninterrupted one does. With mixed sizes
    a step's first group index depends on the draws of the steps before it: they are drawn
    again once (from step 1, or from the last step asked) and remembered.
    """

    @classmethod
    def for_spec(cls, spec) -> GroupSchedule:
        """The schedule of a job spec's training blocks."""
        return cls(training_group_sizes(spec), spec.batch_size, training_ratios(spec), seed=spec.seed)

    def __init__(self, sizes: Sequence[int], batch_size: int, ratios: list[float] | None, *, seed: int):
        self.sizes = list(sizes)
        self.batch_size = batch_size
        self.ratios = ratios
        self.seed = seed
        self.uniform = uniform_size(self.sizes)
        #: step -> the index of its first group (mixed sizes only).
        self._first: dict[int, int] = {1: 0}

    def first_index(self, step: int) -> int:
        """The run-wide index of `step`'s first group; also how many groups the steps before
        it took (the checkpoint's data position after step − 1)."""
        if self.uniform is not None:
            return (step - 1) * (self.batch_size // self.uniform)
        known = max(s for s in self._first if s <= step)
        index = self._first[known]
        for earlier in range(known, step):
            index += len(self._draw(index))
            self._first[earlier + 1] = index
        return index

    def step_groups(self, step: int) -> list[tuple[int, int]]:
        """(run-wide group index, environment index) of each group of `step`, in batch order."""
        first = self.first_index(step)
        environments = self._draw(first)
        if self.uniform is None:
            self._first[step + 1] = first + len(environments)
        return [(first + slot, env) for slot, env in enumerate(environments)]

    def _draw(self, first: int) -> list[int]:
        """The environments of the groups of a step that starts at group `first`."""
        room, environments, index = self.batch_size, [], first
        while room > 0:
            env = fitting_environment_index(index, room, self.sizes, self.ratios, seed=self.seed) if self.uniform is None \
                else environment_index(index, self.ratios, count=len(self.sizes), seed=self.seed)
            environments.append(env)
            room -= self.sizes[env]
            index += 1
        return environments


def micro_batches(groups: list[int], sizes: list[int], micro_batch_rollouts: int) -> list[list[int]]:
    """Split `groups` (indexes into `sizes`, the rollouts of each group) into the chunks of one
    forward/backward pass each, in order: as many whole groups as fit in `micro_batch_rollouts`
    rollouts, and a group larger than that alone. With one K throughout, every chunk but the
    last holds max(1, micro_batch_rollouts // K) groups."""
    chunks, rollouts = [], 0
    for group in groups:
        if not chunks or rollouts + sizes[group] > micro_batch_rollouts:
            chunks.append([])
            rollouts = 0
        chunks[-1].append(group)
        rollouts += sizes[group]
    return chunks
