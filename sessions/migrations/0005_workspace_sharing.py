"""Workspace sharing with read users (issue 12)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0004_session_files"),
    ]

    operations: list[migrations.operations.base.Operation] = []
