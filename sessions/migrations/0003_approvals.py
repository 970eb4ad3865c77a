"""Approvals, session policy rules and their audit trail (issue 11)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0002_rename_response_turn"),
    ]

    operations: list[migrations.operations.base.Operation] = []
