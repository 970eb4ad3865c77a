from django.urls import path

from . import approval_views, file_views, stream_views, views

urlpatterns = [
    path("me", views.MeView.as_view(), name="me"),
    path("agents", views.AgentListView.as_view(), name="agent-list"),
    path("agents/<str:agent_id>", views.AgentDetailView.as_view(), name="agent-detail"),
    path("sessions", views.SessionListView.as_view(), name="session-list"),
    path("sessions/<str:session_id>/items", views.SessionItemsView.as_view(), name="session-items"),
    path("sessions/<str:session_id>/agent", views.SessionAgentView.as_view(), name="session-agent"),
    path(
        "sessions/<str:session_id>/stream",
        stream_views.SessionStreamView.as_view(),
        name="session-stream",
    ),
    path(
        "sessions/<str:session_id>/responses",
        views.ResponseListView.as_view(),
        name="session-responses",
    ),
    path(
        "sessions/<str:session_id>/responses/<str:response_id>",
        views.ResponseDetailView.as_view(),
        name="session-response",
    ),
    path(
        "sessions/<str:session_id>/resources/files",
        file_views.SessionFileListView.as_view(),
        name="session-files",
    ),
    path(
        "sessions/<str:session_id>/resources/files/<str:file_id>",
        file_views.SessionFileDetailView.as_view(),
        name="session-file",
    ),
    path(
        "sessions/<str:session_id>/resources/files/<str:file_id>/content",
        file_views.SessionFileContentView.as_view(),
        name="session-file-content",
    ),
    path(
        "sessions/<str:session_id>/fork", file_views.SessionForkView.as_view(), name="session-fork"
    ),
    path(
        "sessions/<str:session_id>/elicitations",
        approval_views.ElicitationListView.as_view(),
        name="session-elicitations",
    ),
    path(
        "sessions/<str:session_id>/elicitations/<str:elicitation_id>",
        approval_views.ElicitationDetailView.as_view(),
        name="session-elicitation",
    ),
    path(
        "sessions/<str:session_id>/permissions",
        views.PermissionListView.as_view(),
        name="session-permissions",
    ),
    path(
        "sessions/<str:session_id>/permissions/<str:user_id>",
        views.PermissionDetailView.as_view(),
        name="session-permission",
    ),
]
