"""``manage.py rebuild_rollups [--start YYYY-MM-DD] [--end YYYY-MM-DD] [--check]``: the ledger's running totals.

Recomputes the daily cost rollups and every team's totals row from the cost
ledger; ``--check`` only compares them with the ledger and exits 1 when any
row disagrees.
"""

import datetime as dt

from django.core.management.base import BaseCommand, CommandError

from costs.rollups import rebuild_totals, totals_mismatches


class Command(BaseCommand):
    help = ("Rebuild the daily cost rollups (UTC day x team x cluster x accelerator x job) and the teams' "
            "spend totals from the cost ledger, or check them (--check).")

    def add_arguments(self, parser):
        parser.add_argument("--start", type=dt.date.fromisoformat, help="first UTC day (inclusive)")
        parser.add_argument("--end", type=dt.date.fromisoformat, help="last UTC day (inclusive)")
        parser.add_argument("--check", action="store_true", help="compare the totals with the ledger; change nothing")

    def handle(self, *args, start=None, end=None, check=False, **options):
        if check:
            mismatches = totals_mismatches()
            for m in mismatches:
                self.stdout.write(f"{m.kind} {m.key}: stored {m.stored}, ledger {m.ledger}")
            if mismatches:
                raise CommandError(f"{len(mismatches)} totals rows disagree with the ledger")
            self.stdout.write("totals agree with the ledger")
            return
        written = rebuild_totals(start, end)
        self.stdout.write(f"{written} rollup rows written")
