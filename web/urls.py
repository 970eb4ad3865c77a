from django.urls import path

from . import views

urlpatterns = [
    path("", views.sessions_page, name="web-sessions"),
    path("new", views.new_session_page, name="web-new-session"),
    path("s/<str:session_id>", views.session_page, name="web-session"),
    path("inbox", views.inbox_page, name="web-inbox"),
    path("runners", views.runners_page, name="web-runners"),
    path("webhooks", views.webhooks_page, name="web-webhooks"),
    path("schedules", views.schedules_page, name="web-schedules"),
    path("usage", views.usage_page, name="web-usage"),
    path("signin", views.SignInView.as_view(), name="web-signin"),
    path("signout", views.sign_out, name="web-signout"),
]
