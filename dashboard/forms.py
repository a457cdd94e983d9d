"""Dashboard forms: they check the shape of the input; the services in ``lab.services`` decide the rest.

A service refuses bad input with ``lab.errors.LabError``; :func:`add_service_errors` puts its messages on
the form's fields (or on the form as a whole) so the page shows them next to what was typed.
"""

from __future__ import annotations

import hashlib

from django import forms
from django.contrib.auth.forms import AuthenticationForm, PasswordChangeForm
from django.core.exceptions import ValidationError
from django.db import transaction
from labsdk.spec import SpecError, decode_spec

from dashboard.access import refusal_message
from dashboard.spec_editor import param_line
from jobs.webhooks.events import WEBHOOK_EVENT_TYPES
from lab import lockout
from lab.errors import LabError
from lab.models import ApiKeyScope, Role, User
from lab.services import invitation_accept, organization_create, user_sign_up


def add_service_errors(form: forms.Form, error: LabError, field_names: dict[str, str] | None = None) -> None:
    """Add the messages of a service's ``LabError`` to ``form``.

    ``field_names`` maps a service's field name to the form's (``{"name": "organization_name"}``);
    a field the form does not have, and an error without fields, become non-field errors. A
    ``permission_denied`` refusal raises ``PermissionDenied`` (the 403 page).
    """
    field_names = field_names or {}
    message = refusal_message(error)
    if not error.errors:
        form.add_error(None, message)
        return
    for problem in error.errors:
        name = field_names.get(problem.param or "", problem.param)
        form.add_error(name if name in form.fields else None, problem.message)


class SignUpForm(forms.Form):
    """Sign up with an email and a password, and create an organization or join an invited one."""

    email = forms.EmailField(max_length=254, widget=forms.EmailInput(attrs={"autocomplete": "email"}))
    password = forms.CharField(
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="At least 10 characters; not a common password, not all digits.",
    )
    organization_name = forms.CharField(max_length=100, label="Organization name")
    invitation = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, invitation_token: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.invitation_token = invitation_token
        if invitation_token:
            # Joining an organization: the invitation names it, so there is none to create.
            del self.fields["organization_name"]
            self.fields["invitation"].initial = invitation_token

    def save(self) -> User:
        """Create the user and then its organization, or accept the invitation, in one transaction.

        Raises LabError from the services; nothing is created then.
        """
        with transaction.atomic():
            user = user_sign_up(email=self.cleaned_data["email"], password=self.cleaned_data["password"])
            if self.invitation_token:
                invitation_accept(token=self.invitation_token, user=user)
            else:
                organization_create(user=user, name=self.cleaned_data["organization_name"])
        return user

    def add_service_errors(self, error: LabError) -> None:
        """Show a service's LabError on this form."""
        add_service_errors(self, error, {"name": "organization_name"})


class EmailAuthenticationForm(lockout.LockoutAuthenticationMixin, AuthenticationForm):
    """Django's login form, asking for an email address (emails are stored lowercase)."""

    def __init__(self, request=None, *args, **kwargs):
        super().__init__(request, *args, **kwargs)
        self.fields["username"] = forms.EmailField(
            label="Email", max_length=254, widget=forms.EmailInput(attrs={"autocomplete": "email", "autofocus": True})
        )

    def clean_username(self) -> str:
        """Compare emails without regard to case."""
        return self.cleaned_data["username"].strip().lower()


class ThrottledPasswordChangeForm(PasswordChangeForm):
    """Django's password-change form, its current password checked like a sign-in's
    (``lab.lockout.PASSWORD_CHANGE``): counted per account and client address before it is
    checked, refused while either is locked out or the lockout's cache is unreachable; the right
    one forgets the account's wrong ones. ``locked_out`` keeps a refusal for the view."""

    locked_out: lockout.Refused | None = None

    def __init__(self, user, *args, request=None, **kwargs):
        super().__init__(user, *args, **kwargs)
        self.request = request

    def clean_old_password(self) -> str:
        """Check the current password, throttled; raise ValidationError when refused or wrong."""
        return lockout.guarded(self, lockout.PASSWORD_CHANGE, self.user.email, super().clean_old_password)


class OrganizationCreateForm(forms.Form):
    """Name a new organization."""

    name = forms.CharField(max_length=100, label="Organization name")


class ProjectCreateForm(forms.Form):
    """Name a new project; the slug is derived from the name unless given."""

    name = forms.CharField(max_length=100)
    slug = forms.SlugField(max_length=50, required=False, help_text="Optional; derived from the name.")


def _role_choices(*, include_owner: bool) -> list[tuple[str, str]]:
    return [(value, label) for value, label in Role.choices if include_owner or value != Role.OWNER]


class InvitationCreateForm(forms.Form):
    """Invite someone by email with a role (only owners are offered the owner role)."""

    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)

    def __init__(self, *args, include_owner: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = _role_choices(include_owner=include_owner)


class MembershipRoleForm(forms.Form):
    """Change a member's role; the service decides who may grant or take away ownership."""

    role = forms.ChoiceField(choices=Role.choices)


class ApiKeyCreateForm(forms.Form):
    """Name a new API key and choose its access: read, read and write, or inference only (calls
    the project's deployments through the OpenAI-compatible API and nothing else)."""

    ACCESS_SCOPES = {
        "read": [ApiKeyScope.READ], "read_write": [ApiKeyScope.READ, ApiKeyScope.WRITE], "inference": [ApiKeyScope.INFERENCE],
    }

    name = forms.CharField(max_length=100)
    access = forms.ChoiceField(
        choices=[("read_write", "Read and write"), ("read", "Read only"), ("inference", "Inference only (OpenAI-compatible API)")],
        initial="read_write",
        widget=forms.RadioSelect,
    )

    @property
    def scopes(self) -> list[str]:
        """The scopes the chosen access stands for (``["read"]``, ``["read", "write"]`` or ``["inference"]``)."""
        return [str(scope) for scope in self.ACCESS_SCOPES[self.cleaned_data["access"]]]


class JobSpecForm(forms.Form):
    """The "New job" editor: a spec as TOML or JSON text.

    ``clean`` decodes the text (``labsdk.spec.decode_spec``) into ``cleaned_data["data"]``; the
    view validates that data through the jobs services. Problems found by either are kept in
    ``problems`` as ``{"param", "code", "message", "line", "source"}`` dicts (``line`` 1-based, or
    None for the spec as a whole; ``source`` that line's text) so the page can show each next to its
    field.
    """

    FORMATS = (("toml", "TOML"), ("json", "JSON"))

    format = forms.ChoiceField(choices=FORMATS, initial="toml", widget=forms.RadioSelect)
    spec = forms.CharField(
        strip=False,
        widget=forms.Textarea(attrs={"rows": 28, "spellcheck": "false", "autocapitalize": "off", "class": "code"}),
    )
    # The digest of the text whose estimate the user saw: submitting other text estimates again.
    estimated = forms.CharField(required=False, widget=forms.HiddenInput)
    # A one-time token issued with each estimate: the same form posted twice queues one job.
    submission = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.problems: list[dict] = []

    def clean(self) -> dict:
        """Decode the spec text; a decoding problem becomes a problem of the whole spec."""
        cleaned = super().clean()
        text, format = cleaned.get("spec"), cleaned.get("format")
        if text is None or format is None:
            return cleaned
        try:
            cleaned["data"] = decode_spec(text, format)
        except SpecError as error:
            self.add_problems(
                [{"param": problem.param, "code": problem.code, "message": problem.message} for problem in error.errors]
            )
            raise ValidationError("The spec could not be read.", code="invalid_spec") from None
        return cleaned

    def add_problems(self, problems: list[dict]) -> None:
        """Record ``problems`` (``{"param", "code", "message"}``) with the line of each field."""
        text, format = self.data.get("spec", ""), self.data.get("format", "toml")
        lines = text.splitlines()
        for problem in problems:
            param = problem.get("param") or ""
            line = param_line(text, format, param)
            source = lines[line - 1].strip()[:200] if line and line <= len(lines) else ""
            self.problems.append({**problem, "param": param, "line": line, "source": source})

    @property
    def digest(self) -> str:
        """The SHA-256 of the submitted format and text (what ``estimated`` must carry to submit)."""
        text = f"{self.data.get('format', '')}\n{self.data.get('spec', '')}"
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class WebhookEndpointForm(forms.Form):
    """A new webhook endpoint: its URL and the event types it receives (the service checks the URL)."""

    url = forms.CharField(
        max_length=2048,
        label="Endpoint URL",
        widget=forms.URLInput(attrs={"placeholder": "https://example.com/lab-webhooks"}),
    )
    events = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, label="Events")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["events"].choices = [(event_type, event_type) for event_type in WEBHOOK_EVENT_TYPES]
        if not self.is_bound:
            self.initial.setdefault("events", list(WEBHOOK_EVENT_TYPES))
