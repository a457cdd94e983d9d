"""Which groups make each step when `[[env]]` blocks have different group sizes (engine.groups)."""

import pytest

from engine.groups import GroupSchedule, environment_index, group_sizes_list, group_starts, micro_batches, row_groups


def test_with_one_group_size_a_step_takes_the_groups_it_always_took():
    for ratios in (None, [3.0, 1.0]):
        schedule = GroupSchedule([4, 4], 32, ratios, seed=5)
        for step in (1, 2, 7):
            groups = 32 // 4
            expected = [(index, environment_index(index, ratios, count=2, seed=5))
                        for index in range((step - 1) * groups, step * groups)]
            assert schedule.step_groups(step) == expected
        assert schedule.first_index(11) == 80


def test_blocks_of_different_sizes_fill_each_step_with_exactly_batch_size_rollouts():
    sizes = [2, 4, 8]
    for ratios in (None, [1.0, 1.0, 1.0], [5.0, 1.0, 0.5]):
        schedule = GroupSchedule(sizes, 16, ratios, seed=3)
        next_index = 0
        for step in range(1, 40):
            groups = schedule.step_groups(step)
            assert sum(sizes[env] for _, env in groups) == 16
            assert [index for index, _ in groups] == list(range(next_index, next_index + len(groups)))  # no group skipped
            next_index += len(groups)


def test_in_turn_a_group_that_does_not_fit_goes_to_the_next_block_that_fits():
    schedule = GroupSchedule([2, 4], 8, None, seed=0)
    # step 1: 2 + 4, then 2; step 2: 4 + 2, then the 4-block's turn does not fit 2 and the 2-block takes it
    assert schedule.step_groups(1) == [(0, 0), (1, 1), (2, 0)]
    assert schedule.step_groups(2) == [(3, 1), (4, 0), (5, 0)]
    assert schedule.first_index(3) == 6


def test_ratios_still_set_each_blocks_share_of_the_rollouts():
    schedule = GroupSchedule([2, 4], 16, [1.0, 1.0], seed=1)
    rollouts = [0, 0]
    for step in range(1, 2001):
        for _, env in schedule.step_groups(step):
            rollouts[env] += (2, 4)[env]
    # groups are drawn half and half, so the 4-block holds about 2/3 of the rollouts (a little
    # less: a step's last slots go to the 2-block when a group of 4 does not fit)
    assert 0.58 < rollouts[1] / sum(rollouts) < 0.67


def test_a_resumed_run_draws_what_an_uninterrupted_one_does():
    uninterrupted = GroupSchedule([2, 4], 8, [2.0, 1.0], seed=9)
    steps = {step: uninterrupted.step_groups(step) for step in range(1, 30)}
    resumed = GroupSchedule([2, 4], 8, [2.0, 1.0], seed=9)
    assert {step: resumed.step_groups(step) for step in range(17, 30)} == {step: steps[step] for step in range(17, 30)}
    assert resumed.first_index(17) == steps[17][0][0]


def test_rows_and_groups_of_a_mixed_batch():
    assert group_starts([2, 4, 1]) == [0, 2, 6, 7]
    assert row_groups([2, 4, 1]) == [0, 0, 1, 1, 1, 1, 2]
    assert group_sizes_list(3, 9) == [3, 3, 3]
    with pytest.raises(ValueError):
        group_sizes_list([2, 2], 5)


def test_micro_batches_hold_whole_groups_up_to_the_rollout_budget():
    assert micro_batches(list(range(5)), [4] * 5, 8) == [[0, 1], [2, 3], [4]]  # fixed K: 8 // 4 groups each
    assert micro_batches(list(range(3)), [4] * 3, 2) == [[0], [1], [2]]  # a group larger than the budget alone
    assert micro_batches([0, 1, 2, 3], [2, 4, 2, 8], 6) == [[0, 1], [2], [3]]
