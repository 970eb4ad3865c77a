"""The routes clients ask for most, which the project's URLconf tries before all others.

Django tries routes in order, and an ``include`` that does not match still costs
its whole list (each route tried, and the list of tried routes copied for the
404 page) on every request that passes it. A poller asks for the snapshot many
times a second and every turn starts with a message ``POST``, so these two come
first, and with them ``sessions/updates``, which must be tried before
``sessions/<session_id>`` would take it for a session id.
"""

from django.urls import path

from sessions import updates_views

from . import session_views

urlpatterns = [
    path(
        "sessions/updates",
        updates_views.SessionUpdatesView.as_view(),
        name="session-updates",
    ),
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
]
