"""The server process holding a runner's tunnel (runners/liveness.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runners", "0001_initial"),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="runner",
            name="tunnel_process",
            field=models.CharField(blank=True, db_index=True, default="", max_length=64),
        ),
    ]
