"""Episode limits (``max_turns``, ``max_input_tokens``, ``max_output_tokens``) set on an uploaded
package whose ready build recorded it single-turn are warned about at submit and in the
estimate: they have no effect on it (jobs.specs)."""

from __future__ import annotations

import pytest

from environments.models import BuildStatus, EnvironmentBuild
from tests.support.environments import push
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

WARNING = (
    "'env.0.max_turns': acme/digits@0.1.0 is a single-turn environment (one completion per example), so max_turns, "
    "which bounds the turns of a multi-turn episode, has no effect on it; it is stored and ignored"
)


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def _ready(multi_turn) -> None:
    build = EnvironmentBuild.objects.unscoped().get()
    build.status, build.summary = BuildStatus.READY, {"api": "v1", "parameters": [], "multi_turn": multi_turn}
    build.save()


def test_submit_and_the_estimate_warn_of_episode_limits_on_a_single_turn_package(owner, spec):
    assert push(owner, build_wheel("digits", "0.1.0")).status_code == 201
    _ready(False)
    spec["env"] = [{"id": "acme/digits", "max_turns": 4}]
    client = owner.client()

    estimate = client.post("/api/v1/jobs/estimate", spec, format="json")
    created = client.post("/api/v1/jobs", spec, format="json")

    assert estimate.status_code == 200, estimate.content
    assert estimate.json()["warnings"] == [WARNING]
    assert created.status_code == 201, created.content
    assert created.json()["warnings"] == [WARNING]


@pytest.mark.parametrize("multi_turn", [True, None])
def test_a_multi_turn_package_or_one_whose_build_recorded_nothing_is_not_warned_about(owner, spec, multi_turn):
    push(owner, build_wheel("digits", "0.1.0"))
    _ready(multi_turn)
    spec["env"] = [{"id": "acme/digits", "max_turns": 4}]

    assert owner.client().post("/api/v1/jobs/estimate", spec, format="json").json()["warnings"] == []
