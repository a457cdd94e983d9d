"""Billing endpoints under /api/v1."""

from django.urls import path

from billing.api import views

urlpatterns = [
    path("billing/balance", views.BalanceView.as_view(), name="api-billing-balance"),
    path("billing/settings", views.SettingsView.as_view(), name="api-billing-settings"),
    path("billing/checkout", views.CheckoutView.as_view(), name="api-billing-checkout"),
    path("billing/portal", views.PortalView.as_view(), name="api-billing-portal"),
    path("usage", views.UsageView.as_view(), name="api-usage"),
]
