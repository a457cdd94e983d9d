"""Prime's evaluation routes (``prime eval`` of ``prime==0.18.0``, ``prime-evals==0.2.4``), mounted
at ``/prime/api/v1/`` in ``lab/urls.py`` before the jobs app's Prime routes, whose catch-all answers
every other path."""

from django.urls import path

from evaluations.prime import views

urlpatterns = [
    path("evaluations/", views.EvaluationsView.as_view(), name="prime-evaluations"),
    path("evaluations/<str:evaluation_id>", views.EvaluationDetailView.as_view(), name="prime-evaluation"),
    path("evaluations/<str:evaluation_id>/samples", views.EvaluationSamplesView.as_view(), name="prime-evaluation-samples"),
    path("evaluations/<str:evaluation_id>/finalize", views.EvaluationFinalizeView.as_view(), name="prime-evaluation-finalize"),
    path("hosted-evaluations", views.HostedEvaluationsView.as_view(), name="prime-hosted-evaluations"),
    path("hosted-evaluations/<str:evaluation_id>/logs", views.HostedLogsView.as_view(), name="prime-hosted-evaluation-logs"),
    path("hosted-evaluations/<str:evaluation_id>/cancel", views.HostedCancelView.as_view(), name="prime-hosted-evaluation-cancel"),
    path("environmentshub/lookup", views.HubLookupView.as_view(), name="prime-hub-lookup"),
    path("environmentshub/resolve", views.HubResolveView.as_view(), name="prime-hub-resolve"),
    path("environmentshub/<str:owner>/<str:name>/@<str:version>", views.HubVersionView.as_view(), name="prime-hub-version"),
]
