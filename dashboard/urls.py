"""Dashboard routes. The URL names are stable: templates, redirects and later changes use them.

Accounts (anyone)
    home                     /                                the user's organizations; redirects to the only one
    signup                   /signup/                         account + organization; ?invitation=<token> joins; throttled (429)
    login                    /login/                          email + password; locked out after failures (429); 503 while attempts cannot be counted
    logout                   /logout/                         POST only
    password_reset           /password-reset/                 ask for a reset email; throttled (429)
    password_reset_done      /password-reset/sent/
    password_reset_confirm   /password-reset/<uidb64>/<token>/    the emailed link; choose a new password
    password_reset_complete  /password-reset/complete/
    password_change          /password/                       signed in: change the password; wrong current ones locked out like sign-ins (429)
    password_change_done     /password/changed/
    invitation               /invitations/<token>/            show an invitation; POST accepts it

Organizations (members only; anyone else gets the 404 of a missing organization)
    organization_create      /organizations/new/
    organization             /o/<org_slug>/                   projects, members, invitations
    project_create           /o/<org_slug>/projects/          POST; owners and admins
    invitation_create        /o/<org_slug>/invitations/       POST; owners and admins
    invitation_revoke        /o/<org_slug>/invitations/<invitation_id>/revoke/    POST; owners and admins
    membership_role          /o/<org_slug>/members/<membership_id>/role/          POST; owners and admins
    membership_remove        /o/<org_slug>/members/<membership_id>/remove/        POST; owners and admins, or oneself
    audit_log                /o/<org_slug>/audit/             owners only
    billing                  /o/<org_slug>/billing/           plan, balance, spend, usage chart, jobs by cost (members)
    billing_checkout         /o/<org_slug>/billing/checkout/  POST amount_usd: redirect to Stripe Checkout; owners and admins
    billing_portal           /o/<org_slug>/billing/portal/    POST: redirect to the Stripe portal; owners and admins
    billing_settings         /o/<org_slug>/billing/settings/  POST spend limit and concurrency cap; owners and admins

Projects (members of the project's organization; ``<project>`` is /o/<org_slug>/p/<project_slug>/)
    project                  <project>                        jobs table (?status=), "New job", compare
    jobs_table               <project>jobs/table/             the jobs table alone (polled by the project page)
    job_create               <project>jobs/new/               spec editor (?example=); POST estimates, action=submit submits
    job_compare              <project>compare/?job=..&job=..  reward curves of several jobs
    job                      <project>jobs/<job_id>/          status, progress, live charts, rollouts, logs, events, checkpoints
    job_header               <project>jobs/<job_id>/header/   the status header alone
    job_checkpoints          <project>jobs/<job_id>/checkpoints/   the checkpoints list alone
    job_adapters             <project>jobs/<job_id>/adapters/      the adapters list alone
    job_rollouts             <project>jobs/<job_id>/rollouts/?step=   one step's rollouts by group
    job_metrics_data         <project>jobs/<job_id>/data/metrics/     JSON, as GET /api/v1/jobs/{id}/metrics
    job_samples_data         <project>jobs/<job_id>/data/samples/     JSON, as GET /api/v1/jobs/{id}/samples
    job_logs_data            <project>jobs/<job_id>/data/logs/        JSON, as GET /api/v1/jobs/{id}/logs
    job_cancel               <project>jobs/<job_id>/cancel/   confirm (GET); cancel (POST)
    job_restart              <project>jobs/<job_id>/restart/  confirm (GET); restart (POST)
    checkpoint_download      <project>checkpoints/<checkpoint_id>/download/
    adapter_download         <project>adapters/<adapter_id>/download/
    webhooks                 <project>webhooks/               endpoints; POST creates (owners, admins), secret shown once
    webhook_endpoint         <project>webhooks/<endpoint_id>/ deliveries with request and response (?status=)
    webhook_endpoint_enabled <project>webhooks/<endpoint_id>/enabled/   POST enabled=true|false; owners, admins
    webhook_endpoint_rotate  <project>webhooks/<endpoint_id>/rotate/    POST; the new secret shown once
    webhook_endpoint_test    <project>webhooks/<endpoint_id>/test/      POST; owners, admins
    webhook_endpoint_delete  <project>webhooks/<endpoint_id>/delete/    confirm (GET); delete (POST)
    webhook_delivery_redeliver <project>webhooks/<endpoint_id>/deliveries/<delivery_id>/redeliver/   POST
    environments             /o/<org_slug>/environments/        built-ins and the organization's packages
    environment_push         /o/<org_slug>/environments/push/   POST a wheel (owners, admins)
    environment_build_log    /o/<org_slug>/environments/<name>@<version>/build-log/   the latest build's log, as text
    models                   /o/<org_slug>/models/          the catalogue and the organization's own models, with their checks
    model_build_log          /o/<org_slug>/models/<owner>/<name>/build-log/   a pushed model's latest check's log, as text
    environment              /o/<org_slug>/environments/<owner>/<name>/   its versions and the evaluations run on each, best first
    evaluations              <project>evaluations/            the project's evaluations (?status=), compare picked ones
    evaluation_new           <project>evaluations/new/?checkpoint=|adapter=|model=   the "Evaluate" form; POST starts one
    evaluation_compare       <project>evaluations/compare/?evaluation=..&evaluation=..&environment=&show=   2 to 5, example by example
    evaluation               <project>evaluations/<evaluation_id>/   summary per environment, histograms, samples (?environment=&min_reward=&max_reward=&page=)
    evaluation_summary       <project>evaluations/<evaluation_id>/summary/   the header and summary alone (polled while it runs)
    evaluation_sample        <project>evaluations/<evaluation_id>/samples/<sample_id>/   one sample; ?format=text as plain text
    evaluation_cancel        <project>evaluations/<evaluation_id>/cancel/   confirm (GET); cancel (POST)
    evaluation_retry         <project>evaluations/<evaluation_id>/retry/    confirm (GET); retry (POST)
    evaluation_delete        <project>evaluations/<evaluation_id>/delete/   confirm (GET); delete (POST)
    deployments              <project>deployments/            the project's deployments (?status=)
    deployment_new           <project>deployments/new/        POST source_type, source_id: deploy it (the "Deploy" of a checkpoint's or adapter's row)
    deployment               <project>deployments/<deployment_id>/   status, reason, events, requests, tokens, latency; the playground
    deployment_chat          <project>deployments/<deployment_id>/chat/     POST OpenAI's chat body: relayed as the OpenAI-compatible API does (streamed)
    deployment_delete        <project>deployments/<deployment_id>/delete/   POST: unload and stop it
    sandboxes                <project>sandboxes/              the project's sandboxes (?status=): limits, lifetime left, labels
    sandbox_delete           <project>sandboxes/<sandbox_id>/delete/   POST: stop it and delete its files
    api_keys                 /o/<org_slug>/p/<project_slug>/keys/                 list; POST creates (owners, admins)
    api_key_revoke           /o/<org_slug>/p/<project_slug>/keys/<key_id>/revoke/ confirm (GET); revoke (POST)
"""

from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import (
    billing_views,
    deployment_views,
    environment_views,
    evaluation_views,
    job_views,
    model_views,
    sandbox_views,
    views,
    webhook_views,
)
from dashboard.forms import EmailAuthenticationForm

_ORGANIZATION = "o/<slug:org_slug>/"
_PROJECT = _ORGANIZATION + "p/<slug:project_slug>/"
_JOB = _PROJECT + "jobs/<str:job_id>/"
_ENDPOINT = _PROJECT + "webhooks/<str:endpoint_id>/"
_EVALUATION = _PROJECT + "evaluations/<str:evaluation_id>/"
_DEPLOYMENT = _PROJECT + "deployments/<str:deployment_id>/"

urlpatterns = [
    path("", views.home, name="home"),
    # --- accounts ---
    path("signup/", views.sign_up, name="signup"),
    path(
        "login/",
        views.LoginView.as_view(
            template_name="accounts/login.html",
            authentication_form=EmailAuthenticationForm,
            redirect_authenticated_user=True,
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "password-reset/",
        views.PasswordResetView.as_view(
            template_name="accounts/password_reset_form.html",
            email_template_name="accounts/password_reset_email.txt",
            subject_template_name="accounts/password_reset_subject.txt",
        ),
        name="password_reset",
    ),
    path(
        "password-reset/sent/",
        auth_views.PasswordResetDoneView.as_view(template_name="accounts/password_reset_done.html"),
        name="password_reset_done",
    ),
    path(
        "password-reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(template_name="accounts/password_reset_confirm.html"),
        name="password_reset_confirm",
    ),
    path(
        "password-reset/complete/",
        auth_views.PasswordResetCompleteView.as_view(template_name="accounts/password_reset_complete.html"),
        name="password_reset_complete",
    ),
    path(
        "password/",
        views.PasswordChangeView.as_view(template_name="accounts/password_change.html"),
        name="password_change",
    ),
    path(
        "password/changed/",
        auth_views.PasswordChangeDoneView.as_view(template_name="accounts/password_change_done.html"),
        name="password_change_done",
    ),
    path("invitations/<str:token>/", views.invitation_detail, name="invitation"),
    # --- organizations ---
    path("organizations/new/", views.organization_create, name="organization_create"),
    path(_ORGANIZATION, views.organization_detail, name="organization"),
    path(_ORGANIZATION + "projects/", views.project_create, name="project_create"),
    path(_ORGANIZATION + "invitations/", views.invitation_create, name="invitation_create"),
    path(_ORGANIZATION + "invitations/<int:invitation_id>/revoke/", views.invitation_revoke, name="invitation_revoke"),
    path(_ORGANIZATION + "members/<int:membership_id>/role/", views.membership_role, name="membership_role"),
    path(_ORGANIZATION + "members/<int:membership_id>/remove/", views.membership_remove, name="membership_remove"),
    path(_ORGANIZATION + "audit/", views.audit_log, name="audit_log"),
    path(_ORGANIZATION + "billing/", billing_views.billing, name="billing"),
    path(_ORGANIZATION + "billing/checkout/", billing_views.billing_checkout, name="billing_checkout"),
    path(_ORGANIZATION + "billing/portal/", billing_views.billing_portal, name="billing_portal"),
    path(_ORGANIZATION + "billing/settings/", billing_views.billing_settings, name="billing_settings"),
    path(_ORGANIZATION + "environments/", environment_views.environments, name="environments"),
    path(_ORGANIZATION + "models/", model_views.models, name="models"),
    path(_ORGANIZATION + "models/<str:owner>/<str:name>/build-log/", model_views.model_build_log, name="model_build_log"),
    path(_ORGANIZATION + "environments/push/", environment_views.environment_push_view, name="environment_push"),
    path(
        _ORGANIZATION + "environments/<str:environment>/build-log/",
        environment_views.environment_build_log,
        name="environment_build_log",
    ),
    # after build-log, whose <name>@<version>/build-log/ this pattern would also match
    path(_ORGANIZATION + "environments/<str:owner>/<str:name>/", environment_views.environment_detail, name="environment"),
    # --- projects ---
    path(_PROJECT, job_views.project_detail, name="project"),
    path(_PROJECT + "jobs/table/", job_views.jobs_table, name="jobs_table"),
    path(_PROJECT + "jobs/new/", job_views.job_create, name="job_create"),
    path(_PROJECT + "compare/", job_views.job_compare, name="job_compare"),
    path(_JOB, job_views.job_detail, name="job"),
    path(_JOB + "header/", job_views.job_header, name="job_header"),
    path(_JOB + "checkpoints/", job_views.job_checkpoints, name="job_checkpoints"),
    path(_JOB + "adapters/", job_views.job_adapters, name="job_adapters"),
    path(_JOB + "rollouts/", job_views.job_rollouts, name="job_rollouts"),
    path(_JOB + "data/metrics/", job_views.job_metrics_data, name="job_metrics_data"),
    path(_JOB + "data/samples/", job_views.job_samples_data, name="job_samples_data"),
    path(_JOB + "data/logs/", job_views.job_logs_data, name="job_logs_data"),
    path(_JOB + "cancel/", job_views.job_cancel_view, name="job_cancel"),
    path(_JOB + "restart/", job_views.job_restart_view, name="job_restart"),
    path(
        _PROJECT + "checkpoints/<str:checkpoint_id>/download/",
        job_views.checkpoint_download,
        name="checkpoint_download",
    ),
    path(
        _PROJECT + "adapters/<str:adapter_id>/download/",
        job_views.adapter_download,
        name="adapter_download",
    ),
    path(_PROJECT + "deployments/", deployment_views.deployments, name="deployments"),
    path(_PROJECT + "deployments/new/", deployment_views.deployment_new, name="deployment_new"),
    path(_DEPLOYMENT, deployment_views.deployment, name="deployment"),
    path(_DEPLOYMENT + "chat/", deployment_views.deployment_chat, name="deployment_chat"),
    path(_DEPLOYMENT + "delete/", deployment_views.deployment_remove, name="deployment_delete"),
    path(_PROJECT + "sandboxes/", sandbox_views.sandboxes, name="sandboxes"),
    path(_PROJECT + "sandboxes/<str:sandbox_id>/delete/", sandbox_views.sandbox_remove, name="sandbox_delete"),
    path(_PROJECT + "evaluations/", evaluation_views.evaluation_list_view, name="evaluations"),
    path(_PROJECT + "evaluations/new/", evaluation_views.evaluation_new, name="evaluation_new"),
    path(_PROJECT + "evaluations/compare/", evaluation_views.evaluation_compare, name="evaluation_compare"),
    path(_EVALUATION, evaluation_views.evaluation_detail, name="evaluation"),
    path(_EVALUATION + "summary/", evaluation_views.evaluation_summary, name="evaluation_summary"),
    path(_EVALUATION + "samples/<str:sample_id>/", evaluation_views.evaluation_sample, name="evaluation_sample"),
    path(_EVALUATION + "cancel/", evaluation_views.evaluation_cancel_view, name="evaluation_cancel"),
    path(_EVALUATION + "retry/", evaluation_views.evaluation_retry_view, name="evaluation_retry"),
    path(_EVALUATION + "delete/", evaluation_views.evaluation_delete_view, name="evaluation_delete"),
    path(_PROJECT + "webhooks/", webhook_views.webhooks, name="webhooks"),
    path(_ENDPOINT, webhook_views.webhook_endpoint, name="webhook_endpoint"),
    path(_ENDPOINT + "enabled/", webhook_views.webhook_endpoint_enabled, name="webhook_endpoint_enabled"),
    path(_ENDPOINT + "rotate/", webhook_views.webhook_endpoint_rotate, name="webhook_endpoint_rotate"),
    path(_ENDPOINT + "test/", webhook_views.webhook_endpoint_test, name="webhook_endpoint_test"),
    path(_ENDPOINT + "delete/", webhook_views.webhook_endpoint_delete, name="webhook_endpoint_delete"),
    path(
        _ENDPOINT + "deliveries/<str:delivery_id>/redeliver/",
        webhook_views.webhook_delivery_redeliver,
        name="webhook_delivery_redeliver",
    ),
    path(_PROJECT + "keys/", views.api_keys, name="api_keys"),
    path(_PROJECT + "keys/<str:key_id>/revoke/", views.api_key_revoke, name="api_key_revoke"),
]
