"""``manage.py rebuild_rollups [--start YYYY-MM-DD] [--end YYYY-MM-DD]``: rebuild daily cost rollups from the ledger."""

import datetime as dt

from django.core.management.base import BaseCommand

from costs.rollups import rebuild_rollups


class Command(BaseCommand):
    help = "Rebuild the daily cost rollups (team x cluster x accelerator x UTC day) from the cost ledger."

    def add_arguments(self, parser):
        parser.add_argument("--start", type=dt.date.fromisoformat, help="first UTC day (inclusive)")
        parser.add_argument("--end", type=dt.date.fromisoformat, help="last UTC day (inclusive)")

    def handle(self, *args, start=None, end=None, **options):
        written = rebuild_rollups(start, end)
        self.stdout.write(f"{written} rollup rows written")
