from django.urls import path

from . import session_views, views

urlpatterns = [
    path(
        "sessions/<str:session_id>",
        session_views.SessionDetailView.as_view(),
        name="session-detail",
    ),
    path(
        "sessions/<str:session_id>/events",
        session_views.SessionEventsView.as_view(),
        name="session-events",
    ),
    path("runners", views.RunnerListView.as_view(), name="runner-list"),
    path("runners/<str:runner_id>", views.RunnerDetailView.as_view(), name="runner-detail"),
    path("runners/<str:runner_id>/status", views.RunnerStatusView.as_view(), name="runner-status"),
]
