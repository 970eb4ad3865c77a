from django.urls import path

from . import views

urlpatterns = [
    path(
        "sessions/<str:session_id>/resources/environments/<str:env>/changes",
        views.ChangesView.as_view(),
        name="session-changes",
    ),
    path(
        "sessions/<str:session_id>/resources/environments/<str:env>/diff/<path:path>",
        views.DiffView.as_view(),
        name="session-diff",
    ),
]
