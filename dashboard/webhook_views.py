"""Dashboard pages for a project's webhook endpoints: list, create, enable/disable, rotate the
secret, send a test event, delete, and read deliveries (request and response) with "redeliver".

Thin adapters over ``jobs.webhooks.endpoints``. Every member can read the endpoints and their
deliveries; only owners and admins change them (403 before the form is read), as with API keys,
and the services refuse anyone else too. A secret is shown once, in the answer of the POST that
made it (create, rotate), never again.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.access import OrganizationAccess, project_view
from dashboard.forms import WebhookEndpointForm
from dashboard.views import _actor, _render
from jobs.webhooks.endpoints import (
    delivery_redeliver,
    endpoint_create,
    endpoint_delete,
    endpoint_rotate_secret,
    endpoint_send_test,
    endpoint_update,
)
from jobs.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from lab.errors import LabError
from lab.models import Project
from lab.tenancy import get_owned

DELIVERIES_PAGE_SIZE = 25


def _endpoint(project: Project, endpoint_id: str) -> WebhookEndpoint:
    """Return the project's endpoint ``endpoint_id``; Http404 for a missing or foreign one."""
    return get_owned(WebhookEndpoint.objects.all(), project, endpoint_id, "webhook endpoint", error=_no_such)


def _no_such(what: str) -> Http404:
    return Http404(f"No such {what}.")


def _add_api_errors(form: WebhookEndpointForm, error: LabError) -> None:
    """Put a service's field errors (``url``, ``events.N``) on the form's fields."""
    for item in error.errors or []:
        name = (item.param or "").split(".")[0]
        form.add_error(name if name in form.fields else None, item.message)
    if not error.errors:
        form.add_error(None, error.message)


def _list_page(request, access, project, *, form=None, created=None, status=200) -> HttpResponse:
    endpoints = WebhookEndpoint.objects.filter(project=project).order_by("-id")
    context = {
        "project": project,
        "endpoints": endpoints,
        "form": form or (WebhookEndpointForm() if access.can_manage else None),
        "created": created,
    }
    response = _render(request, "dashboard/webhooks.html", context, access=access, status=status)
    if created:
        response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@project_view
def webhooks(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """List the project's endpoints; POST creates one (owners and admins) and shows its secret once."""
    if request.method == "GET":
        return _list_page(request, access, project)
    access.require_manager()
    form = WebhookEndpointForm(request.POST)
    if form.is_valid():
        data = {"url": form.cleaned_data["url"], "events": form.cleaned_data["events"]}
        try:
            endpoint = endpoint_create(project=project, actor=_actor(request), data=data)
        except LabError as error:
            _add_api_errors(form, error)
        else:
            return _list_page(request, access, project, form=WebhookEndpointForm(), created=endpoint)
    return _list_page(request, access, project, form=form)


@require_GET
@project_view
def webhook_endpoint(
    request: HttpRequest, access: OrganizationAccess, project: Project, endpoint_id: str
) -> HttpResponse:
    """One endpoint with its deliveries, newest first (``?status=`` pending, succeeded or failed)."""
    endpoint = _endpoint(project, endpoint_id)
    return _endpoint_page(request, access, project, endpoint)


def _endpoint_page(request, access, project, endpoint, *, rotated=False) -> HttpResponse:
    status = request.GET.get("status") or ""
    if status not in DeliveryStatus.values:
        status = ""
    deliveries = (
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .select_related("message__job_event__job")
        .prefetch_related("attempts")
        .order_by("-id")
    )
    if status:
        deliveries = deliveries.filter(status=status)
    page = Paginator(deliveries, DELIVERIES_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "project": project,
        "endpoint": endpoint,
        "page": page,
        "deliveries": [(delivery, sorted(delivery.attempts.all(), key=lambda a: a.number)) for delivery in page],
        "status": status,
        "statuses": DeliveryStatus.values,
        "rotated": rotated,
    }
    response = _render(request, "dashboard/webhook_endpoint.html", context, access=access)
    if rotated:
        response["Cache-Control"] = "no-store"
    return response


def _back(access, project, endpoint) -> HttpResponse:
    return redirect(
        "webhook_endpoint", org_slug=access.organization.slug, project_slug=project.slug, endpoint_id=endpoint.public_id
    )


@require_POST
@project_view
def webhook_endpoint_enabled(
    request: HttpRequest, access: OrganizationAccess, project: Project, endpoint_id: str
) -> HttpResponse:
    """Enable (``enabled=true``) or disable (``enabled=false``) an endpoint (owners and admins)."""
    access.require_manager()
    endpoint = _endpoint(project, endpoint_id)
    choice = request.POST.get("enabled")
    if choice not in ("true", "false"):
        messages.error(request, "Choose to enable or to disable the endpoint.")
        return _back(access, project, endpoint)
    endpoint_update(endpoint=endpoint, actor=_actor(request), data={"enabled": choice == "true"})
    messages.success(request, f"{'Enabled' if choice == 'true' else 'Disabled'} the endpoint.")
    return _back(access, project, endpoint)


@require_POST
@project_view
def webhook_endpoint_rotate(
    request: HttpRequest, access: OrganizationAccess, project: Project, endpoint_id: str
) -> HttpResponse:
    """Give the endpoint a new secret and show it once (the old one also signs for 24 hours)."""
    access.require_manager()
    endpoint = endpoint_rotate_secret(endpoint=_endpoint(project, endpoint_id), actor=_actor(request))
    return _endpoint_page(request, access, project, endpoint, rotated=True)


@require_POST
@project_view
def webhook_endpoint_test(
    request: HttpRequest, access: OrganizationAccess, project: Project, endpoint_id: str
) -> HttpResponse:
    """Send a ``webhook.test`` event to the endpoint (owners and admins)."""
    access.require_manager()
    endpoint = _endpoint(project, endpoint_id)
    try:
        delivery = endpoint_send_test(endpoint=endpoint, actor=_actor(request))
    except LabError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Sent a test event (delivery {delivery.public_id}).")
    return _back(access, project, endpoint)


@require_http_methods(["GET", "POST"])
@project_view
def webhook_endpoint_delete(
    request: HttpRequest, access: OrganizationAccess, project: Project, endpoint_id: str
) -> HttpResponse:
    """Confirm (GET), then delete (POST) an endpoint with its deliveries (owners and admins)."""
    access.require_manager()
    endpoint = _endpoint(project, endpoint_id)
    if request.method == "POST":
        endpoint_delete(endpoint=endpoint, actor=_actor(request))
        messages.success(request, "Deleted the webhook endpoint.")
        return redirect("webhooks", org_slug=access.organization.slug, project_slug=project.slug)
    return _render(
        request, "dashboard/webhook_endpoint_delete.html", {"project": project, "endpoint": endpoint}, access=access
    )


@require_POST
@project_view
def webhook_delivery_redeliver(
    request: HttpRequest, access: OrganizationAccess, project: Project, endpoint_id: str, delivery_id: str
) -> HttpResponse:
    """Try a delivery again now, with the same ``webhook-id`` and body (owners and admins)."""
    access.require_manager()
    endpoint = _endpoint(project, endpoint_id)
    delivery = WebhookDelivery.objects.filter(endpoint=endpoint, public_id=delivery_id[:64]).first()
    if delivery is None:
        raise Http404("No such delivery.")
    try:
        delivery_redeliver(delivery=delivery, actor=_actor(request))
    except LabError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Delivering {delivery.public_id} again.")
    return _back(access, project, endpoint)
