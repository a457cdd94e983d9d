"""Reads of the model registry: the models an organization may use (``installed_models``: what
a job may name) and those it sees (``model_list``: what ``GET /models`` and the dashboard list,
with the organization's pushed models still being checked or refused), each with its latest check."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db.models import Q

from engine.catalog import list_models
from jobs.registry import registry_fields
from jobs.registry.models import Model, ModelBuild, ModelStatus
from lab.errors import not_found
from lab.models import Organization


def _visible(organization: Organization | None) -> Q:
    visible = Q(organization__isnull=True)
    if organization is not None:
        visible |= Q(organization=organization)
    return visible


def model_list(organization: Organization | None = None) -> dict[str, Model]:
    """Return the models ``organization`` sees, keyed by catalogue id, in id order: the registry's
    models offered to everyone and, with ``organization``, its own whatever their status
    (another organization's are absent, as a missing model is). A Hugging Face directory an
    operator placed in ``LAB_MODEL_DIR`` since the last ``manage.py models sync`` is listed too,
    as an unsaved row offered to everyone, unless the registry holds its id."""
    models = {model.id: model for model in Model.objects.filter(_visible(organization)).select_related("organization")}
    model_dir = Path(settings.LAB_MODEL_DIR)
    unsynced = {model_id: info for model_id, info in list_models(model_dir).items() if model_id not in models}
    if unsynced:
        registered = set(Model.objects.filter(id__in=unsynced).values_list("id", flat=True))
        models |= {model_id: Model(**registry_fields(info, model_dir)) for model_id, info in unsynced.items() if model_id not in registered}
    return dict(sorted(models.items()))


def installed_models(organization: Organization | None = None) -> dict[str, Model]:
    """Return the models ``organization`` may use, keyed by catalogue id: ``model_list``'s that
    are ``ready`` (a pushed model whose check has not passed yet is left out)."""
    return {model_id: model for model_id, model in model_list(organization).items() if model.status == ModelStatus.READY}


def model_get(*, organization: Organization, model_id: str) -> Model:
    """Return the model ``model_id`` as ``organization`` sees it (``model_list``). Raises LabError
    ``not_found`` for a missing model and for another organization's, alike."""
    model = model_list(organization).get(model_id)
    if model is None:
        raise not_found("model")
    return model


def latest_builds(organization: Organization | None) -> dict[str, ModelBuild]:
    """The latest check of each of ``organization``'s pushed models, by model id (one query)."""
    if organization is None:
        return {}
    builds = ModelBuild.objects.for_organization(organization).order_by("model_id", "number")
    return {build.model_id: build for build in builds}  # the highest number wins
