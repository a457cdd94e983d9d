"""``manage.py models sync|add``: the model registry from the operator's side (docs/models.md)."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from jobs.models import Model
from jobs.registry import sync_models
from jobs.registry.services import model_add
from lab.errors import LabError
from lab.models import Organization

#: The first argument of ``add`` that offers a model to every organization.
PUBLIC = "public"


class Command(BaseCommand):
    help = (
        "The model registry. sync: write the built-in models and the Hugging Face directories in "
        "LAB_MODEL_DIR as models offered to everyone (idempotent; migrate runs it too). "
        "add ORG_SLUG|public HF_ID [--revision R] [--from DIR]: download a model from the Hugging Face "
        "endpoint (HF_ENDPOINT, HF_TOKEN), or read it from DIR, check it, store it and offer it to one "
        "organization or to everyone; prints one JSON line."
    )

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("sync", help="write the engine's catalogue into the registry")
        add = actions.add_parser("add", help="add a model from the Hugging Face endpoint or a directory")
        add.add_argument("owner", metavar="ORG_SLUG|public", help="the organization that may use it, or 'public' for everyone")
        add.add_argument("model_id", metavar="HF_ID", help="the model's Hub id (owner/name); with --from, the id it gets")
        add.add_argument("--revision", help="a branch, tag or commit of the Hub repository (default: its main branch)")
        add.add_argument("--from", dest="source_dir", type=Path, metavar="DIR", help="read the model from this directory instead")

    def handle(self, *args, action: str, **options) -> None:
        if action == "sync":
            created, updated = sync_models(Model)
            self.stdout.write(f"models: {created} created, {updated} updated, {Model.objects.count()} in the registry")
            return
        owner = options["owner"]
        organization = None
        if owner != PUBLIC:
            organization = Organization.objects.filter(slug=owner).first()
            if organization is None:
                raise CommandError(f"no organization {owner!r}: name one by its slug, or 'public' for everyone")
        if options["source_dir"] is not None and options["revision"]:
            raise CommandError("--revision names a Hub revision: it does not go with --from")
        try:
            added = model_add(
                organization=organization, model_id=options["model_id"], revision=options["revision"],
                source_dir=options["source_dir"],
            )
        except LabError as error:
            raise CommandError(error.message) from None
        model = added.model
        if added.left_out:
            self.stderr.write(f"left out (Lab stores model files only): {', '.join(added.left_out[:20])}")
        self.stdout.write(json.dumps({
            "id": model.id, "owned_by": owner if organization else None, "revision": model.revision,
            "architecture": model.architecture, "parameters": model.parameters,
            "active_parameters": model.active_parameters, "context_length": model.context_length,
            "chat_template": model.chat_template, "memory_gb": model.memory_gb, "files": len(model.files),
            "size_bytes": model.size_bytes, "stored_bytes": added.stored_bytes, "seconds": round(added.seconds, 2),
        }))
