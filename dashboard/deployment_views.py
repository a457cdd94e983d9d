"""Dashboard pages for deployments (docs/serving.md): the project's list, a deployment's page
(status, reason, events, requests, tokens, cost, latency percentiles) with its playground, the
"Deploy" action of a checkpoint's, an adapter's or a model's row, and delete.

Thin adapters over ``serving.services`` and ``serving.selectors``, shown through
``dashboard.deployment_presenter``. Every deployment is looked up *with* the project that
``dashboard.access`` resolved for the signed-in member, so another organization's deployment is
the same 404 as a missing one on every page. Any member may deploy, delete and chat, as a
read-write API key of the project may.

The playground's chat is relayed by ``serving.api.views.relay``, the OpenAI-compatible API's own
relay, for the signed-in member (session and CSRF token; no API key in the page): the same body
checks, billing, waking, streaming and token ledger as a call with a key.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from dashboard.access import OrganizationAccess, organization_access, project_in, project_view, refusal_message
from dashboard.deployment_presenter import STATUSES, deployment_row, openai_snippet, usage_summary
from dashboard.views import _actor, _render
from engine.serving_protocol import parse_chat
from lab.errors import LabError
from lab.models import Project
from serving.api.gateway import in_thread, member_prepare
from serving.api.views import relay
from serving.models import Deployment, SourceType
from serving.selectors import deployment_events, deployment_get, deployment_list, deployment_request_stats
from serving.serializers import event_to_dict
from serving.services import deployment_create, deployment_delete


def _deployment(project: Project, deployment_id: str) -> Deployment:
    deployment = deployment_get(project, deployment_id)
    if deployment is None:
        raise Http404("No such deployment.")
    return deployment


@require_GET
@project_view
def deployments(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """The project's deployments, newest first (``?status=``)."""
    status = request.GET.get("status") or None
    if status not in (None, *STATUSES):
        status = None
    rows = [deployment_row(deployment) for deployment in deployment_list(project, status=status)]
    context = {"project": project, "rows": rows, "status": status, "statuses": STATUSES}
    return _render(request, "dashboard/deployments.html", context, access=access)


@require_GET
@project_view
def deployment(request: HttpRequest, access: OrganizationAccess, project: Project, deployment_id: str) -> HttpResponse:
    """A deployment's page: status, reason, events, requests, tokens, latency; the playground."""
    found = _deployment(project, deployment_id)
    context = {
        "project": project,
        "deployment": deployment_row(found),
        "usage": usage_summary(deployment_request_stats(found)),
        "events": [event_to_dict(event) for event in deployment_events(found)],
        "snippet": openai_snippet(found),
    }
    return _render(request, "dashboard/deployment.html", context, access=access)


@require_POST
@project_view
def deployment_new(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """Deploy the checkpoint, adapter or model that the form names (``source_type``, ``source_id``)
    and open its page; a refusal goes back with its message."""
    source_type = request.POST.get("source_type", "")
    data = {"source": {"type": source_type, "id": request.POST.get("source_id", "")}}
    if source_type not in SourceType.values:
        messages.error(request, "Choose a checkpoint, an adapter or a model to deploy.")
        return redirect("deployments", access.organization.slug, project.slug)
    try:
        created = deployment_create(project=project, actor=_actor(request), data=data)
    except LabError as error:
        messages.error(request, refusal_message(error))
        return redirect("deployments", access.organization.slug, project.slug)
    return redirect("deployment", access.organization.slug, project.slug, created.public_id)


@require_POST
@project_view
def deployment_remove(request: HttpRequest, access: OrganizationAccess, project: Project, deployment_id: str) -> HttpResponse:
    """Delete a deployment (it unloads, then stops) and show its page again."""
    deployment_delete(deployment=_deployment(project, deployment_id), actor=_actor(request))
    messages.success(request, "The deployment is unloading; it stops once its server lets it go.")
    return redirect("deployment", access.organization.slug, project.slug, deployment_id)


@in_thread
def _member_deployment(user, org_slug: str, project_slug: str, deployment_id: str) -> tuple[Project, Deployment]:
    """Return the project and deployment a member may chat with; Http404 for anyone else's."""
    project = project_in(organization_access(user=user, organization_slug=org_slug), project_slug)
    return project, _deployment(project, deployment_id)


async def deployment_chat(request: HttpRequest, org_slug: str, project_slug: str, deployment_id: str) -> HttpResponse:
    """``POST`` OpenAI's chat completion body for the playground: relayed to the deployment as the
    OpenAI-compatible API relays it (streamed when it asks), for the signed-in member."""
    user = await request.auser()
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    project, found = await _member_deployment(user, org_slug, project_slug, deployment_id)
    return await relay(request, "/v1/chat/completions", parse_chat, prepare=lambda model: member_prepare(user.pk, project, model), model=found.name)
