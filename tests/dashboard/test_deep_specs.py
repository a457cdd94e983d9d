"""The "New job" editor given a spec nested hundreds of levels deep (TOML or JSON text): the
problem is shown next to its line and nothing is created, never a RecursionError (a 500, or
with DEBUG on Django's technical page with the traceback)."""

from __future__ import annotations

import pytest

from jobs.models import Job
from tests.support.dashboard import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker", "default_prices")]

MESSAGE = "nested deeper than the 32 levels of tables and arrays a spec may have"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(("format", "text"), [
    ("json", '{"name": "deep",\n"max_steps": ' + nested(500) + "}"),
    ("toml", 'name = "deep"\nmax_steps = ' + nested(400)),
    ("toml", 'name = "deep"\nmax_steps = ' + nested(33)),
], ids=["json-500", "toml-400", "toml-33"])
def test_a_deeply_nested_spec_is_shown_as_a_problem_and_creates_nothing(owner, format, text):
    url = f"/o/{owner.organization.slug}/p/{owner.project.slug}/jobs/new/"

    response = signed_in(owner.user).post(url, {"format": format, "spec": text, "action": "submit"})

    assert response.status_code == 200
    problems = response.context["form"].problems
    assert [(problem["param"], problem["code"], problem["message"], problem["line"]) for problem in problems] == [
        ("max_steps", "too_deep", MESSAGE, 2)
    ]
    assert MESSAGE in response.content.decode()
    assert Job.objects.unscoped().count() == 0
