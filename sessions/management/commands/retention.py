"""``manage.py retention [--dry-run]``: one retention run now (sessions/retention.py)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from sessions import retention


class Command(BaseCommand):
    help = (
        "Archive idle sessions, delete long-archived ones, compact event logs and drop old "
        "audit records, as the settings say (lifecycle.md, Retention). With --dry-run, "
        "report what would go and change nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would go; remove nothing"
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        report = retention.run(dry_run=options["dry_run"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict()))
            return
        verb = "would remove" if report.dry_run else "removed"
        self.stdout.write(f"retention ({'dry run' if report.dry_run else 'done'}):")
        self.stdout.write(
            f"  sessions archived{' (would be)' if report.dry_run else ''}: "
            f"{report.archived_sessions}"
        )
        for label, value in (
            ("sessions", report.deleted_sessions),
            ("  their items", report.deleted_items),
            ("  their events", report.deleted_events),
            ("  their files", report.deleted_files),
            ("compacted events", report.compacted_events),
            ("audit records", report.deleted_audit_records),
        ):
            self.stdout.write(f"  {verb} {label}: {value}")
