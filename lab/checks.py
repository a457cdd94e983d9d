"""System checks of Lab's own settings, run by ``manage.py check`` (``--deploy`` for production ones)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register

#: Django's mail backends that send nothing, by the short name the warning uses.
_UNSENT_MAIL_BACKENDS = {
    "django.core.mail.backends.console.EmailBackend": "console",
    "django.core.mail.backends.dummy.EmailBackend": "dummy",
    "django.core.mail.backends.locmem.EmailBackend": "locmem",
}


@register(Tags.security, deploy=True)
def check_outgoing_mail(app_configs=None, **kwargs) -> list[CheckMessage]:
    """Warn (``lab.W001``) when EMAIL_BACKEND sends no mail: invitations and password resets then
    never arrive, and the console backend (the default) writes their links into the web log,
    where anyone who reads it can reset a password or join an organization."""
    name = _UNSENT_MAIL_BACKENDS.get(settings.EMAIL_BACKEND)
    if name is None:
        return []
    where = " but written to the web server's log." if name == "console" else "."
    return [
        Warning(
            f"EMAIL_BACKEND is Django's {name} backend: invitation and password-reset emails, links included, "
            f"are not sent{where}",
            hint="Set EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend and EMAIL_HOST, EMAIL_PORT, "
            "EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS and DEFAULT_FROM_EMAIL (README: Configuration).",
            id="lab.W001",
        )
    ]
