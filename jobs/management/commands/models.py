"""``manage.py models sync``: write the engine's catalogue into the model registry."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from jobs.models import Model
from jobs.registry import sync_models


class Command(BaseCommand):
    help = (
        "The model registry. sync: write the built-in models and the Hugging Face directories in "
        "LAB_MODEL_DIR as models offered to everyone (idempotent; migrate runs it too)."
    )

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("sync", help="write the engine's catalogue into the registry")

    def handle(self, *args, action: str, **options) -> None:
        created, updated = sync_models(Model)
        self.stdout.write(f"models: {created} created, {updated} updated, {Model.objects.count()} in the registry")
