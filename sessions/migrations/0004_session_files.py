"""Session files: uploaded inputs stored by content hash (issue 12)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import omnigent_site.ids


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0003_approvals"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.CreateModel(
            name="FileBlob",
            fields=[
                ("sha256", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("bytes", models.PositiveBigIntegerField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.CreateModel(
            name="SessionFile",
            fields=[
                (
                    "id",
                    models.CharField(
                        default=omnigent_site.ids.new_file_id,
                        editable=False,
                        max_length=64,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("name", models.CharField(max_length=255)),
                ("bytes", models.PositiveBigIntegerField()),
                ("content_type", models.CharField(max_length=128)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "blob",
                    models.ForeignKey(
                        db_column="sha256",
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="session_files",
                        to="agent_sessions.fileblob",
                    ),
                ),
                (
                    "created_by",
                    models.ForeignKey(
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
                        related_name="files",
                        to="agent_sessions.session",
                    ),
                ),
            ],
            options={
                "ordering": ["created_at", "id"],
                "indexes": [
                    models.Index(fields=["session", "created_at"], name="session_file_created")
                ],
            },
        ),
    ]
