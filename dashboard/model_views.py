"""The organization's models page: the catalogue it may use and its own models, pushed or added
for it, with each pushed model's latest check (status, error, a link to its log) (docs/models.md)."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET

from dashboard.access import OrganizationAccess, organization_view
from dashboard.views import _render
from jobs.registry.builds import build_log
from jobs.registry.selectors import latest_builds, model_get, model_list
from lab.errors import LabError


@require_GET
@organization_view
def models(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """List the models offered to everyone and the organization's own, each with its size,
    context, modes, memory estimate and, for a pushed one, its latest check."""
    organization = access.organization
    builds = latest_builds(organization)
    rows = []
    for model in model_list(organization).values():
        owner, _, name = model.id.partition("/")
        build = builds.get(model.id)
        rows.append({
            "model": model, "build": build,
            "log_url": reverse("model_build_log", kwargs={"org_slug": organization.slug, "owner": owner, "name": name}) if build else "",
        })
    own = [row for row in rows if row["model"].organization_id == organization.pk]
    catalogue = [row for row in rows if row["model"].organization_id is None]
    return _render(request, "dashboard/models.html", {"own": own, "catalogue": catalogue}, access=access)


@require_GET
@organization_view
def model_build_log(request: HttpRequest, access: OrganizationAccess, owner: str, name: str) -> HttpResponse:
    """The log of the latest check of the organization's model ``<owner>/<name>``, as text; 404
    for a model it does not see (another organization's, as a missing one) or one never pushed."""
    try:
        model = model_get(organization=access.organization, model_id=f"{owner}/{name}")
    except LabError:
        raise Http404("No such model.") from None
    build = latest_builds(access.organization).get(model.id)
    if build is None:
        raise Http404("This model was not pushed: it has no check log.")
    return HttpResponse(build_log(build), content_type="text/plain; charset=utf-8")
