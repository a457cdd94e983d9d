"""Lab: the Django project (settings, tenancy, audit, API conventions) and the Celery app."""

from lab.celery import app as celery_app

__all__ = ["celery_app"]
