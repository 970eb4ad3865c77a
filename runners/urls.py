from django.urls import path

from . import views

urlpatterns = [
    path("runners", views.RunnerListView.as_view(), name="runner-list"),
    path("runners/<str:runner_id>", views.RunnerDetailView.as_view(), name="runner-detail"),
    path("runners/<str:runner_id>/status", views.RunnerStatusView.as_view(), name="runner-status"),
]
