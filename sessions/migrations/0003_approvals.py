"""Approvals, session policy rules and their audit trail (issue 11)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import omnigent_site.ids


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0002_rename_response_turn"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="session",
            name="policy_rules",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.CreateModel(
            name="Approval",
            fields=[
                (
                    "id",
                    models.CharField(
                        default=omnigent_site.ids.new_elicitation_id,
                        editable=False,
                        max_length=64,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("call_id", models.CharField(max_length=256)),
                ("tool", models.CharField(max_length=256)),
                ("arguments", models.JSONField(default=dict)),
                ("policy_name", models.CharField(max_length=256)),
                ("policy_reason", models.TextField(blank=True, default="")),
                ("message", models.TextField()),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("accepted", "Accepted"),
                            ("declined", "Declined"),
                            ("cancelled", "Cancelled"),
                            ("expired", "Expired"),
                        ],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("expires_at", models.DateTimeField()),
                ("resolved_at", models.DateTimeField(blank=True, null=True)),
                ("reason", models.TextField(blank=True, null=True)),
                ("runner_acked", models.BooleanField(default=False)),
                (
                    "resolved_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "session",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="approvals",
                        to="agent_sessions.session",
                    ),
                ),
                (
                    "turn",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="approvals",
                        to="agent_sessions.turn",
                    ),
                ),
            ],
            options={
                "ordering": ["created_at", "id"],
                "indexes": [
                    models.Index(
                        fields=["session", "status", "created_at"], name="approval_session"
                    ),
                    models.Index(fields=["status", "expires_at"], name="approval_due"),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("turn", "call_id"), name="unique_approval_per_call"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="PolicyChange",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField(auto_now_add=True)),
                ("old_rules", models.JSONField(default=list)),
                ("new_rules", models.JSONField(default=list)),
                (
                    "session",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="policy_changes",
                        to="agent_sessions.session",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["at", "id"],
                "indexes": [models.Index(fields=["session", "at"], name="policy_change_session")],
            },
        ),
    ]
