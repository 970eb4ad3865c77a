"""Every ``/v1`` route, in the order Django tries them (http-api.md lists the endpoints).

Order matters twice: Django tries routes top to bottom on every request, so the routes
clients ask for most come first (a poller reads the snapshot many times a second and
every turn starts with a message ``POST``); and ``sessions/updates`` (and ``sessions/import``) must come before
``sessions/<session_id>``, which would take ``updates`` for a session id. Past the hot
routes, grouped by resource. ``tests/unit/test_api_urls.py`` checks that every ``/v1``
view is defined in this package.
"""

from django.urls import path, re_path

from . import (
    approval_views,
    audit_views,
    budget_views,
    change_views,
    elicitation_views,
    file_views,
    pin_views,
    runner_views,
    schedule_views,
    session_views,
    stream_views,
    transfer_views,
    updates_views,
    usage_views,
    views,
    webhook_views,
    workspace_views,
)
from .api_docs import OfflineRedocView, SchemaView, SwaggerView
from .api_root import ApiRootView, unknown_route

_SESSION = "sessions/<str:session_id>"
_ENVIRONMENT = f"{_SESSION}/resources/environments/<str:env>"

urlpatterns = [
    # Hot routes first: the session-list stream, the snapshot, the message POST.
    path("sessions/updates", updates_views.SessionUpdatesView.as_view(), name="session-updates"),
    # Before the snapshot too, which would take ``import`` for a session id.
    path("sessions/import", transfer_views.SessionImportView.as_view(), name="session-import"),
    path(_SESSION, session_views.SessionDetailView.as_view(), name="session-detail"),
    path(f"{_SESSION}/events", session_views.SessionEventsView.as_view(), name="session-events"),
    # Sessions.
    path("sessions", views.SessionListView.as_view(), name="session-list"),
    path(f"{_SESSION}/export", transfer_views.SessionExportView.as_view(), name="session-export"),
    path(f"{_SESSION}/agent", views.SessionAgentView.as_view(), name="session-agent"),
    path(f"{_SESSION}/pin", pin_views.SessionPinView.as_view(), name="session-pin"),
    path(f"{_SESSION}/fork", file_views.SessionForkView.as_view(), name="session-fork"),
    path(
        f"{_SESSION}/permissions",
        views.PermissionListView.as_view(),
        name="session-permissions",
    ),
    path(
        f"{_SESSION}/permissions/<str:user_id>",
        views.PermissionDetailView.as_view(),
        name="session-permission",
    ),
    # Items and turns (the API calls a turn a response).
    path(f"{_SESSION}/items", views.SessionItemsView.as_view(), name="session-items"),
    path(f"{_SESSION}/responses", views.ResponseListView.as_view(), name="session-responses"),
    path(
        f"{_SESSION}/responses/<str:response_id>",
        views.ResponseDetailView.as_view(),
        name="session-response",
    ),
    # Stream.
    path(f"{_SESSION}/stream", stream_views.SessionStreamView.as_view(), name="session-stream"),
    # Session files.
    path(
        f"{_SESSION}/resources/files",
        file_views.SessionFileListView.as_view(),
        name="session-files",
    ),
    path(
        f"{_SESSION}/resources/files/<str:file_id>",
        file_views.SessionFileDetailView.as_view(),
        name="session-file",
    ),
    path(
        f"{_SESSION}/resources/files/<str:file_id>/content",
        file_views.SessionFileContentView.as_view(),
        name="session-file-content",
    ),
    # Workspace: files on the runner's machine, and the stored change set.
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
    path(f"{_ENVIRONMENT}/changes", change_views.ChangesView.as_view(), name="session-changes"),
    path(
        f"{_ENVIRONMENT}/diff/<path:path>",
        change_views.DiffView.as_view(),
        name="session-diff",
    ),
    # Approvals and policies.
    path(
        f"{_SESSION}/elicitations",
        elicitation_views.ElicitationListView.as_view(),
        name="session-elicitations",
    ),
    path(
        f"{_SESSION}/elicitations/<str:elicitation_id>",
        elicitation_views.ElicitationDetailView.as_view(),
        name="session-elicitation",
    ),
    path(
        f"{_SESSION}/elicitations/<str:elicitation_id>/resolve",
        approval_views.ElicitationResolveView.as_view(),
        name="session-elicitation-resolve",
    ),
    path(
        f"{_SESSION}/policies",
        approval_views.SessionPoliciesView.as_view(),
        name="session-policies",
    ),
    # Runners.
    path("runners", runner_views.RunnerListView.as_view(), name="runner-list"),
    path("runners/<str:runner_id>", runner_views.RunnerDetailView.as_view(), name="runner-detail"),
    path(
        "runners/<str:runner_id>/status",
        runner_views.RunnerStatusView.as_view(),
        name="runner-status",
    ),
    # Webhooks (automation.md).
    path("webhooks", webhook_views.WebhookListView.as_view(), name="webhook-list"),
    path(
        "webhooks/<str:webhook_id>",
        webhook_views.WebhookDetailView.as_view(),
        name="webhook-detail",
    ),
    path(
        "webhooks/<str:webhook_id>/rotate-secret",
        webhook_views.WebhookRotateSecretView.as_view(),
        name="webhook-rotate-secret",
    ),
    path(
        "webhooks/<str:webhook_id>/test",
        webhook_views.WebhookTestView.as_view(),
        name="webhook-test",
    ),
    path(
        "webhooks/<str:webhook_id>/deliveries",
        webhook_views.DeliveryListView.as_view(),
        name="webhook-deliveries",
    ),
    path(
        "webhooks/<str:webhook_id>/deliveries/<str:delivery_id>/redeliver",
        webhook_views.DeliveryRedeliverView.as_view(),
        name="webhook-redeliver",
    ),
    # Agents.
    path("agents", views.AgentListView.as_view(), name="agent-list"),
    path("agents/<str:agent_id>", views.AgentDetailView.as_view(), name="agent-detail"),
    # Scheduled tasks (automation.md).
    path(
        "scheduled-tasks",
        schedule_views.ScheduledTaskListView.as_view(),
        name="scheduled-task-list",
    ),
    path(
        "scheduled-tasks/preview",
        schedule_views.ScheduledTaskPreviewView.as_view(),
        name="scheduled-task-preview",
    ),
    path(
        "scheduled-tasks/<str:task_id>",
        schedule_views.ScheduledTaskDetailView.as_view(),
        name="scheduled-task-detail",
    ),
    path(
        "scheduled-tasks/<str:task_id>/runs",
        schedule_views.ScheduledRunListView.as_view(),
        name="scheduled-task-runs",
    ),
    path(
        "scheduled-tasks/<str:task_id>/run",
        schedule_views.ScheduledTaskRunView.as_view(),
        name="scheduled-task-run",
    ),
    # Me.
    path("me", views.MeView.as_view(), name="me"),
    path("inbox", views.InboxView.as_view(), name="inbox"),
    # The audit log.
    path("audit", audit_views.AuditListView.as_view(), name="audit-list"),
    # Usage and cost (docs/usage.md).
    path("usage", usage_views.UsageView.as_view(), name="usage-report"),
    path("users/<str:user_id>/budget", budget_views.UserBudgetView.as_view(), name="user-budget"),
    # The API's root and documents.
    path("", ApiRootView.as_view(), name="api-root"),
    path("schema", SchemaView.as_view(), name="schema"),
    path("docs", SwaggerView.as_view(url_name="schema"), name="docs"),
    path("redoc", OfflineRedocView.as_view(url_name="schema"), name="redoc"),
    # Any other /v1 path: a 404 in the error format.
    re_path(r"", unknown_route),
]
