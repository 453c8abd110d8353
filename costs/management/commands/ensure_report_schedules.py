"""``manage.py ensure_report_schedules``: create the default daily and weekly report schedules (idempotent)."""

from django.core.management.base import BaseCommand

from costs.reports.schedules import ensure_report_schedules


class Command(BaseCommand):
    help = "Create missing daily/weekly report PeriodicTask rows, per team and platform-wide (edits are kept)."

    def handle(self, *args, **options):
        tasks = ensure_report_schedules()
        self.stdout.write(f"{len(tasks)} report schedules in place")
