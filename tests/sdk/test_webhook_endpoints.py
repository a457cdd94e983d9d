"""Webhook endpoints from the SDK (``lab.webhooks``) and the CLI (``lab webhooks``), against the
fake Lab: create (its secret shown once), list, test, deliveries, rotate and delete."""

from __future__ import annotations

import labsdk as lab
from labsdk import NotFoundError
from labsdk._webhooks import WebhookDelivery, WebhookEndpoint, Webhooks
from labsdk.cli import main


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_the_module_level_webhooks_create_list_test_and_delete_through_the_default_client(lab_env):
    from labsdk.webhooks import verify  # importing the receiving side leaves lab.webhooks as it was

    assert callable(verify)
    assert isinstance(lab.default_client().webhooks, Webhooks)
    endpoint = lab.webhooks.create("https://example.com/hook", events=["job.succeeded"])

    assert isinstance(endpoint, WebhookEndpoint)
    assert endpoint.id.startswith("whep_") and endpoint.secret.startswith("whsec_")
    assert lab_env.requests[-1].headers.get("idempotency-key")
    assert [e.id for e in lab.webhooks.list()] == [endpoint.id]
    assert lab.webhooks.list()[0].secret is None
    delivery = lab.webhooks.test(endpoint.id)
    assert isinstance(delivery, WebhookDelivery) and delivery.event_type == "webhook.test"
    assert [d.id for d in lab.webhooks.deliveries(endpoint.id, status="pending")] == [delivery.id]
    assert lab.webhooks.rotate_secret(endpoint.id).secret == "whsec_rotated"
    lab.webhooks.delete(endpoint.id)
    assert lab.webhooks.list() == []


def test_an_endpoint_outside_the_project_is_not_found(lab_client):
    try:
        lab_client.webhooks.retrieve("whep_missing")
    except NotFoundError as exc:
        assert exc.status_code == 404
    else:
        raise AssertionError("expected NotFoundError")


def test_lab_webhooks_create_prints_the_secret_once_then_list_test_and_delete(lab_env, capsys):
    status, out, err = run(capsys, "webhooks", "create", "https://example.com/hook", "--event", "job.succeeded")

    assert status == 0, err
    assert "id:     whep_" in out and "secret: whsec_" in out
    assert "never shows it again" in err
    endpoint_id = next(iter(lab_env.webhook_endpoints))
    assert lab_env.webhook_endpoints[endpoint_id]["events"] == ["job.succeeded"]

    status, out, _ = run(capsys, "webhooks")
    assert status == 0 and endpoint_id in out and "https://example.com/hook" in out and "whsec_" not in out
    status, out, _ = run(capsys, "webhooks", "test", endpoint_id)
    assert status == 0 and "webhook.test pending" in out and f"lab webhooks deliveries {endpoint_id}" in out
    status, out, _ = run(capsys, "webhooks", "deliveries", endpoint_id)
    assert status == 0 and "webhook.test" in out and "pending" in out
    assert run(capsys, "webhooks", "rotate-secret", endpoint_id)[1] == "whsec_rotated\n"
    assert run(capsys, "webhooks", "delete", endpoint_id)[:2] == (0, f"{endpoint_id} deleted\n")
    assert lab_env.webhook_endpoints == {}


def test_a_loopback_receiver_refused_says_how_to_allow_it_locally(lab_env, capsys):
    status, out, err = run(capsys, "webhooks", "create", "http://127.0.0.1:9000/hook")

    assert status == 1 and out == ""
    assert "[private_address]" in err
    assert "LAB_WEBHOOK_ALLOW_PRIVATE=1" in err and "make up" in err
