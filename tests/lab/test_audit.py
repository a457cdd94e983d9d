"""The audit log's writer: one row per action, only for actions listed in AuditAction."""

from __future__ import annotations

import pytest

from lab.audit import Actor, AuditAction, audit_record
from lab.logging import request_id_var
from lab.models import AuditLogEntry

pytestmark = pytest.mark.django_db


def test_it_writes_one_row_with_the_actor_the_action_and_the_request_id(owner):
    token = request_id_var.set("req-audit-1")
    try:
        entry = audit_record(
            actor=Actor(api_key=owner.api_key),
            organization=owner.organization,
            project=owner.project,
            action=AuditAction.PROJECT_CREATE,
            target="default",
            data={"name": "Default"},
        )
    finally:
        request_id_var.reset(token)
    stored = AuditLogEntry.objects.get(pk=entry.pk)
    assert (stored.action, stored.target, stored.data, stored.request_id) == (
        "project.create",
        "default",
        {"name": "Default"},
        "req-audit-1",
    )
    assert (stored.actor_user, stored.actor_api_key, stored.project) == (None, owner.api_key, owner.project)


def test_it_refuses_an_action_that_is_not_listed_and_writes_nothing(owner):
    before = AuditLogEntry.objects.count()
    with pytest.raises(ValueError):
        audit_record(actor=Actor.system(), organization=owner.organization, action="project.creat")
    assert AuditLogEntry.objects.count() == before


def test_every_action_reads_object_dot_verb():
    for action in AuditAction:
        subject, _, verb = action.value.partition(".")
        assert subject and verb and action.name == f"{subject}_{verb}".upper()
