from django.urls import path

from . import approval_views, views, workspace_views

_ENVIRONMENT = "sessions/<str:session_id>/resources/environments/<str:env>"

urlpatterns = [
    path(
        f"{_ENVIRONMENT}/filesystem",
        workspace_views.FilesystemRootView.as_view(),
        name="workspace-root",
    ),
    path(
        f"{_ENVIRONMENT}/filesystem/<path:path>",
        workspace_views.FilesystemPathView.as_view(),
        name="workspace-path",
    ),
    path(f"{_ENVIRONMENT}/search", workspace_views.SearchView.as_view(), name="workspace-search"),
    path(
        "sessions/<str:session_id>/elicitations/<str:elicitation_id>/resolve",
        approval_views.ElicitationResolveView.as_view(),
        name="session-elicitation-resolve",
    ),
    path(
        "sessions/<str:session_id>/policies",
        approval_views.SessionPoliciesView.as_view(),
        name="session-policies",
    ),
    path("runners", views.RunnerListView.as_view(), name="runner-list"),
    path("runners/<str:runner_id>", views.RunnerDetailView.as_view(), name="runner-detail"),
    path("runners/<str:runner_id>/status", views.RunnerStatusView.as_view(), name="runner-status"),
]
