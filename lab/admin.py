"""Django admin for accounts and tenancy (staff only)."""

from django import forms
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from lab.lockout import LockoutAuthenticationMixin
from lab.models import ApiKey, AuditLogEntry, Invitation, Membership, Organization, Project, User
from lab.services import organization_slug_problem


class AdminLoginForm(LockoutAuthenticationMixin, AdminAuthenticationForm):
    """The admin's sign-in, locked out like the dashboard's: it takes the same passwords."""


admin.site.login_form = AdminLoginForm


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    ordering = ["email"]
    list_display = ["email", "name", "is_staff", "is_active", "date_joined"]
    search_fields = ["email", "name"]
    fieldsets = (
        (None, {"fields": ("email", "password", "name")}),
        ("Permissions", {"fields": ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")}),
    )
    add_fieldsets = ((None, {"classes": ("wide",), "fields": ("email", "password1", "password2")}),)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class OrganizationAdminForm(forms.ModelForm):
    """The admin's organization form: a new or changed slug may not be a reserved one
    (``lab.services.reserved_organization_slugs``)."""

    class Meta:
        model = Organization
        fields = "__all__"

    def clean_slug(self) -> str:
        slug = self.cleaned_data["slug"]
        problem = organization_slug_problem(slug) if slug != self.instance.slug else None
        if problem:
            raise forms.ValidationError(problem)
        return slug


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    form = OrganizationAdminForm
    list_display = ["slug", "name", "public_id", "max_running_jobs", "created_at"]
    search_fields = ["slug", "name", "public_id"]
    inlines = [MembershipInline]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "organization", "public_id", "created_at"]
    search_fields = ["slug", "public_id"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "project", "scopes", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "public_id"]


admin.site.register(Invitation)
admin.site.register(AuditLogEntry)
