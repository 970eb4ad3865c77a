"""Session files: uploaded inputs stored by content hash (issue 12)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0003_approvals"),
    ]

    operations: list[migrations.operations.base.Operation] = []
