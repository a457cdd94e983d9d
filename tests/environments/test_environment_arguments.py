"""``[[env]] args`` of an uploaded package are checked at submit and in the estimate against the
arguments its latest ready build recorded, for every kind (Lab, ``load_environment``, v1): an
argument it does not take is ``unknown_key`` naming those it takes, a value that does not fit a
simple recorded type (int, float, str, bool) is ``invalid_type``; before a ready build nothing is
checked, since nothing is known yet."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from labsdk.spec import argument_problems, type_problem

from environments.models import BuildStatus, EnvironmentBuild
from tests.support.environments import push
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

PARAMETERS = [
    {"name": "min_digits", "default": 1, "type": "int", "required": False},
    {"name": "max_digits", "default": 5, "type": "int", "required": False},
    {"name": "temperature", "default": 0.5, "type": "float", "required": False},
    {"name": "prompt", "default": None, "type": "str | None", "required": False},
    {"name": "strict", "default": True, "type": "bool", "required": False},
    {"name": "words", "default": ["a"], "type": "list[str]", "required": False},
]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def _ready(api: str) -> None:
    build = EnvironmentBuild.objects.unscoped().get()
    build.status, build.summary = BuildStatus.READY, {"api": api, "parameters": PARAMETERS}
    build.save()


@pytest.mark.parametrize(("value", "fits"), [
    (3, True), (3.0, False), (True, False), ("3", False), (None, False),
])
def test_an_int_takes_integers_only(value, fits):
    assert (type_problem(value, PARAMETERS[0]) is None) is fits


def test_a_float_takes_an_integer_an_optional_takes_null_and_other_types_are_not_checked():
    assert type_problem(2, PARAMETERS[2]) is None and type_problem(False, PARAMETERS[2]) is not None
    assert type_problem(None, PARAMETERS[3]) is None and type_problem(7, PARAMETERS[3]) == "must be a string (str | None), not an integer"
    assert type_problem("yes", PARAMETERS[4]) is not None and type_problem(False, PARAMETERS[4]) is None
    assert type_problem({"any": "thing"}, PARAMETERS[5]) is None
    assert type_problem(1, {"name": "x", "default": None, "type": None}) is None  # not annotated


@pytest.mark.parametrize(("api", "taker"), [("lab", "it takes"), ("v0", "its load_environment takes"), ("v1", "its taskset config takes")])
def test_every_kind_names_the_arguments_it_takes(api, taker):
    env = SimpleNamespace(args={"max_digit": 3, "min_digits": "1"})

    problems = argument_problems("env.0", env, "acme/digits@0.1.0", {"api": api, "parameters": PARAMETERS})

    assert [(problem.param, problem.code) for problem in problems] == [
        ("env.0.args.max_digit", "unknown_key"), ("env.0.args.min_digits", "invalid_type"),
    ]
    assert problems[0].message == (
        f"'acme/digits@0.1.0' takes no argument 'max_digit': {taker} min_digits, max_digits, temperature, prompt, strict, words"
    )
    assert problems[1].message == "'min_digits' of 'acme/digits@0.1.0' must be an integer (int), not a string"


@pytest.mark.parametrize("api", ["lab", "v0", "v1"])
def test_submit_and_the_estimate_refuse_arguments_the_ready_build_does_not_take(owner, spec, api):
    assert push(owner, build_wheel("digits", "0.1.0")).status_code == 201
    _ready(api)
    client = owner.client()
    spec["env"] = [{"id": "acme/digits", "args": {"max_digit": 3, "max_digits": 2.5, "words": ["x", "y"]}}]

    for path in ("/api/v1/jobs/estimate", "/api/v1/jobs"):
        refused = client.post(path, spec, format="json")
        assert refused.status_code == 400, refused.content
        error = refused.json()["error"]
        assert error["code"] == "invalid_spec"
        assert [(item["param"], item["code"]) for item in error["errors"]] == [
            ("env.0.args.max_digit", "unknown_key"), ("env.0.args.max_digits", "invalid_type"),
        ]
        assert "takes no argument 'max_digit'" in error["message"] and "min_digits, max_digits" in error["message"]

    spec["env"] = [{"id": "acme/digits", "args": {"max_digits": 2, "temperature": 1}}]
    spec["eval"] = {"interval": 1, "env": [{"id": "acme/digits", "num_examples": 2, "args": {"split": "test", "strict": False}}]}
    assert client.post("/api/v1/jobs", spec, format="json").status_code == 201  # an eval block's split is Lab's own


def test_an_eval_blocks_arguments_are_checked_too(owner, spec):
    push(owner, build_wheel("digits", "0.1.0"))
    _ready("lab")
    spec["eval"] = {"interval": 1, "env": [{"id": "acme/digits@0.1.0", "num_examples": 2, "args": {"strict": "no"}}]}

    refused = owner.client().post("/api/v1/jobs/estimate", spec, format="json")

    assert [(item["param"], item["code"]) for item in refused.json()["error"]["errors"]] == [("eval.env.0.args.strict", "invalid_type")]


def test_a_spec_that_fails_its_shape_still_has_its_arguments_checked(owner, spec):
    push(owner, build_wheel("digits", "0.1.0"))
    _ready("v0")
    spec["env"] = [{"id": "acme/digits", "args": {"max_digit": 3}}]
    spec["colour"] = "blue"

    errors = owner.client().post("/api/v1/jobs/estimate", spec, format="json").json()["error"]["errors"]

    assert ("env.0.args.max_digit", "unknown_key") in [(item["param"], item["code"]) for item in errors]


def test_nothing_is_checked_before_a_ready_build(owner, spec):
    push(owner, build_wheel("digits", "0.1.0"))
    spec["env"] = [{"id": "acme/digits", "args": {"anything": 1}}]

    assert owner.client().post("/api/v1/jobs/estimate", spec, format="json").status_code == 200


def test_the_environment_object_lists_the_arguments_of_its_ready_build(owner):
    push(owner, build_wheel("digits", "0.1.0"))
    client = owner.client()
    listed = lambda: next(item for item in client.get("/api/v1/environments").json()["data"] if item["id"] == "acme/digits@0.1.0")  # noqa: E731
    assert listed()["args"] == {}  # before its build is ready nothing is known
    _ready("v0")

    expected = {"min_digits": 1, "max_digits": 5, "temperature": 0.5, "prompt": None, "strict": True, "words": ["a"]}
    assert listed()["args"] == expected
    assert client.get("/api/v1/environments/acme/digits@0.1.0").json()["args"] == expected
