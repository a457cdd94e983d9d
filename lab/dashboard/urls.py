"""Dashboard routes. The URL names are stable: templates, redirects and later changes use them.

Accounts (anyone)
    home                     /                                the user's organizations; redirects to the only one
    signup                   /signup/                         account + organization; ?invitation=<token> joins
    login                    /login/                          email + password
    logout                   /logout/                         POST only
    password_reset           /password-reset/                 ask for a reset email
    password_reset_done      /password-reset/sent/
    password_reset_confirm   /password-reset/<uidb64>/<token>/    the emailed link; choose a new password
    password_reset_complete  /password-reset/complete/
    password_change          /password/                       signed in: change the password
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

Projects (members of the project's organization)
    project                  /o/<org_slug>/p/<project_slug>/
    api_keys                 /o/<org_slug>/p/<project_slug>/keys/                 list; POST creates (owners, admins)
    api_key_revoke           /o/<org_slug>/p/<project_slug>/keys/<key_id>/revoke/ confirm (GET); revoke (POST)
"""

from django.contrib.auth import views as auth_views
from django.urls import path

from lab.dashboard import views
from lab.dashboard.forms import EmailAuthenticationForm

_ORGANIZATION = "o/<slug:org_slug>/"
_PROJECT = _ORGANIZATION + "p/<slug:project_slug>/"

urlpatterns = [
    path("", views.home, name="home"),
    # --- accounts ---
    path("signup/", views.sign_up, name="signup"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="accounts/login.html",
            authentication_form=EmailAuthenticationForm,
            redirect_authenticated_user=True,
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "password-reset/",
        auth_views.PasswordResetView.as_view(
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
        auth_views.PasswordChangeView.as_view(template_name="accounts/password_change.html"),
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
    # --- projects ---
    path(_PROJECT, views.project_detail, name="project"),
    path(_PROJECT + "keys/", views.api_keys, name="api_keys"),
    path(_PROJECT + "keys/<str:key_id>/revoke/", views.api_key_revoke, name="api_key_revoke"),
]
