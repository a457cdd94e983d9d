"""Dashboard routes."""

from django.urls import path

from lab.dashboard import views

urlpatterns = [
    path("", views.home, name="home"),
]
