"""Workspace sharing with read users (issue 12)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0004_session_files"),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="session",
            name="share_workspace_files",
            field=models.BooleanField(default=False),
        ),
    ]
