"""The turn model is called ``Turn`` (it was ``Response``, a name every view had to
rename to avoid DRF's ``Response``). API names (``response_id``, ``/responses``) stay."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0001_initial"),
    ]

    operations = [
        migrations.RenameModel(old_name="Response", new_name="Turn"),
        migrations.AlterField(
            model_name="turn",
            name="session",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="turns",
                to="agent_sessions.session",
            ),
        ),
        migrations.RenameIndex(
            model_name="turn",
            new_name="turn_session_created",
            old_name="response_session_created",
        ),
        migrations.RenameIndex(
            model_name="turn",
            new_name="turn_session_status",
            old_name="response_session_status",
        ),
    ]
