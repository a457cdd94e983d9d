"""Billing's routes outside /api/v1: Stripe's webhook."""

from django.urls import path

from billing import views

urlpatterns = [path("stripe/webhook", views.stripe_webhook, name="stripe-webhook")]
