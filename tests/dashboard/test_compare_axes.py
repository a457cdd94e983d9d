"""The compare page's tokens axis: each step at the tokens trained on up to it (``perf/tokens``)."""

from __future__ import annotations

import pytest

from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]


def report(job, points: dict[int, dict[str, float]]) -> None:
    engine = Engine(job)
    engine.running(0)
    engine.post("metrics", {"attempt": 1, "points": [
        {"step": step, "time": f"2026-11-29T22:10:{step:02d}Z", "values": values} for step, values in points.items()
    ]})


def series(client, jobs, x: str) -> dict[str, list[list[float]]]:
    query = [("job", job.public_id) for job in jobs] + [("x", x)]
    response = client.get("/o/acme/p/default/compare/", query)
    assert response.status_code == 200
    return {line["id"]: line["points"] for line in response.context["page_data"]["series"]}


def test_steps_sit_at_the_running_sum_of_their_tokens(owner, owner_client, spec):
    long, short = submit(owner, spec, name="long"), submit(owner, spec, name="short")
    report(long, {1: {"reward/mean": 0.1, "perf/tokens": 300}, 2: {"reward/mean": 0.2, "perf/tokens": 500}})
    report(short, {1: {"reward/mean": 0.3, "perf/tokens": 100}, 2: {"reward/mean": 0.4, "perf/tokens": 100}})

    assert series(owner_client, [long, short], "tokens") == {
        long.public_id: [[300.0, 0.1], [800.0, 0.2]], short.public_id: [[100.0, 0.3], [200.0, 0.4]],
    }
    assert series(owner_client, [long], "step") == {long.public_id: [[1, 0.1], [2, 0.2]]}


def test_steps_after_one_without_a_token_count_are_left_off_the_tokens_axis(owner, owner_client, spec):
    job = submit(owner, spec)
    report(job, {1: {"reward/mean": 0.1, "perf/tokens": 50}, 2: {"reward/mean": 0.2}, 3: {"reward/mean": 0.3, "perf/tokens": 50}})

    assert series(owner_client, [job], "tokens") == {job.public_id: [[50.0, 0.1]]}
    assert series(owner_client, [job], "nonsense") == {job.public_id: [[1, 0.1], [2, 0.2], [3, 0.3]]}  # step
