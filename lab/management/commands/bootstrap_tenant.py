"""``manage.py bootstrap_tenant``: create or reuse a user, organization and project; print a new key."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from lab.bootstrap import bootstrap_tenant
from lab.errors import LabError


class Command(BaseCommand):
    help = (
        "Create (or reuse) the user, organization and project and a new read-write API key; "
        "the last stdout line is one JSON object."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--org", required=True, help="organization slug")
        parser.add_argument("--project", required=True, help="project slug")
        parser.add_argument("--email", required=True, help="the owner's email")
        parser.add_argument("--password", default=None, help="set the user's password (dashboard login)")

    def handle(self, *args, org: str, project: str, email: str, password: str | None, **options) -> None:
        try:
            result = bootstrap_tenant(organization_slug=org, project_slug=project, email=email, password=password)
        except LabError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(json.dumps(result))
