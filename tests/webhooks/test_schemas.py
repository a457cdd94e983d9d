"""Endpoint bodies through pydantic (jobs.webhooks.schemas): Lab's codes, every problem listed."""

from __future__ import annotations

import pytest

from jobs.webhooks.events import WEBHOOK_EVENT_TYPES
from jobs.webhooks.schemas import parse_endpoint_create, parse_endpoint_update
from lab.api.errors import http_status
from lab.errors import LabError

URL = "https://93.184.215.14/hooks/lab"


def problems(parse, body) -> tuple[str, list[tuple[str | None, str]]]:
    with pytest.raises(LabError) as refused:
        parse(body, allow_private=False)
    assert (http_status(refused.value), refused.value.code) == (400, "invalid_request")
    return refused.value.message, [(item.param, item.code) for item in refused.value.errors]


def test_a_create_fills_in_every_event_type_and_enabled_and_strips_the_url():
    body = parse_endpoint_create({"url": f"  {URL} "}, allow_private=False)
    assert (body.url, body.events, body.enabled) == (URL, list(WEBHOOK_EVENT_TYPES), True)


def test_it_lists_every_problem_unknown_fields_first():
    body = {"enabled": "yes", "events": ["job.failed", "job.exploded", 5], "url": "ftp://example.com/", "secret": "x"}
    assert problems(parse_endpoint_create, body) == (
        "5 problems in the request.",
        [
            ("secret", "unknown_field"),
            ("url", "unsupported_scheme"),
            ("events.1", "unknown_event_type"),
            ("events.2", "unknown_event_type"),
            ("enabled", "invalid"),
        ],
    )


def test_one_problem_is_the_message():
    assert problems(parse_endpoint_create, {}) == ("Give the endpoint's URL.", [("url", "required")])
    assert problems(parse_endpoint_create, {"url": URL, "events": []}) == (
        "events must be a non-empty list of event types.",
        [("events", "invalid")],
    )


def test_a_private_address_says_which_setting_allows_it_and_the_setting_does():
    message, found = problems(parse_endpoint_create, {"url": "http://10.1.2.3/hook"})
    assert found == [("url", "private_address")]
    assert message.endswith(" Private and loopback addresses need LAB_WEBHOOK_ALLOW_PRIVATE.")
    assert parse_endpoint_create({"url": "http://10.1.2.3/hook"}, allow_private=True).url == "http://10.1.2.3/hook"


def test_an_update_changes_only_the_fields_given_without_repeats():
    assert parse_endpoint_update({}, allow_private=False).changes() == {}
    repeated = {"events": ["job.failed", "job.queued", "job.failed"]}
    assert parse_endpoint_update(repeated, allow_private=False).changes() == {"events": ["job.failed", "job.queued"]}
    assert parse_endpoint_update({"enabled": False}, allow_private=False).changes() == {"enabled": False}


@pytest.mark.parametrize(("field", "code"), [("url", "required"), ("events", "invalid"), ("enabled", "invalid")])
def test_an_update_refuses_null_for_every_field(field, code):
    assert problems(parse_endpoint_update, {field: None})[1] == [(field, code)]


@pytest.mark.parametrize("body", [[], "x", None, 5])
def test_a_body_that_is_not_an_object_is_refused_as_a_whole(body):
    assert problems(parse_endpoint_create, body) == ("The body must be a JSON object.", [])
