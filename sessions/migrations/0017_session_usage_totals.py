"""``Session.usage_totals``: a session's usage sums by model on its row, filled from its
``usage.SessionUsage`` rows (summed over their days)."""

from typing import Any

from django.db import migrations, models
from django.db.models import Sum

SUM_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
    "llm_calls",
    "priced_calls",
    "cost_nano",
)


def fill_totals(apps: Any, schema_editor: Any) -> None:
    session_usage = apps.get_model("usage", "SessionUsage")
    session = apps.get_model("agent_sessions", "Session")
    totals: dict[str, dict[str, dict[str, int]]] = {}
    rows = (
        session_usage.objects.values("session_id", "model")
        .annotate(**{name: Sum(name) for name in SUM_FIELDS})
        .order_by("session_id", "model")
    )
    for row in rows:
        sums = {name: int(row[name] or 0) for name in SUM_FIELDS}
        totals.setdefault(row["session_id"], {})[row["model"]] = sums
    for session_id, by_model in totals.items():
        session.objects.filter(pk=session_id).update(usage_totals=by_model)


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0016_merge_budget_start_acked"),
        ("usage", "0002_budgets"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="usage_totals",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(fill_totals, migrations.RunPython.noop),
    ]
