"""Who made a change: the agent or a person through the workspace API (issue 12)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workspaces", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="filechange",
            name="attribution",
            field=models.CharField(
                choices=[("agent", "Agent"), ("user", "User")], default="agent", max_length=16
            ),
        ),
    ]
