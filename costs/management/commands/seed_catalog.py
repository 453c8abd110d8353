"""``manage.py seed_catalog``: accelerators and public list prices (idempotent)."""

from django.core.management.base import BaseCommand

from costs.seed import seed_accelerators, seed_cpu_prices, seed_prices


class Command(BaseCommand):
    help = "Create the accelerators and the price catalog from costs/data/*.csv (idempotent)."

    def handle(self, *args, **options):
        a = seed_accelerators()
        p = seed_prices() + seed_cpu_prices()
        if options["verbosity"] > 0:
            self.stdout.write(f"accelerators created: {a}, prices created: {p}")
