"""``manage.py sync_prices [--file PATH] [--keep-edits]``: load the YAML price table
(``OMNIGENT_PRICES``, else the shipped one) into the database (docs/usage.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from usage.pricing import PriceFileError
from usage.services import price_file, sync_prices


class Command(BaseCommand):
    help = "Load the YAML price table (OMNIGENT_PRICES, else the shipped one) into the database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--file", help="the YAML file (default: OMNIGENT_PRICES)")
        parser.add_argument(
            "--keep-edits",
            action="store_true",
            help="only add models the table lacks; keep the rows already stored",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["file"]) if options["file"] else price_file()
        try:
            created, updated = sync_prices(path=path, overwrite=not options["keep_edits"])
        except PriceFileError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{path}: {created} prices added, {updated} changed")
