from django.contrib import admin

from .models import FileChange


@admin.register(FileChange)
class FileChangeAdmin(admin.ModelAdmin):
    list_display = [
        "path",
        "session",
        "status",
        "attribution",
        "lines_added",
        "lines_removed",
        "changed_at",
    ]
    list_filter = ["status", "attribution"]
    search_fields = ["path", "session__id"]
    raw_id_fields = ["session"]
