"""``manage.py rotate_credentials``: re-encrypt every stored cluster credential with the newest encryption key."""

from django.core.management.base import BaseCommand

from runners.credentials import configured_keys, rotate_stored


class Command(BaseCommand):
    """Run ``runners.credentials.rotate_stored`` and print its counts and every credential no key reads.

    Rotating a key: put the new key first in ``FIELD_ENCRYPTION_KEYS`` (the old one after it) on every process,
    run this command, then drop the old key. Idempotent: a second run finds everything current and writes nothing.
    Exit status 0 even when some credential is unreadable (it is listed; no key configured now reads it, so
    dropping the old key cannot make it worse): re-enter those credentials.
    """

    help = ("Re-encrypt every stored cluster credential with the newest key of FIELD_ENCRYPTION_KEYS (idempotent); "
            "list each credential that no configured key can read (left as stored).")

    def handle(self, *args, **options) -> None:
        """Rotate, then print ``rotated N, already current N, empty N, changed meanwhile N, unreadable N`` and one
        line per unreadable credential (its cluster, field and reason)."""
        keys = configured_keys()
        if not keys:
            self.stderr.write("No FIELD_ENCRYPTION_KEYS is configured: credentials use the key derived from "
                              "SECRET_KEY (development only).")
        report = rotate_stored()
        self.stdout.write(f"rotated {report.rotated}, already current {report.current}, empty {report.empty}, "
                          f"changed meanwhile {report.changed}, unreadable {len(report.unreadable)}")
        for row, field, reason in report.unreadable:
            self.stdout.write(self.style.WARNING(f"unreadable: {row}, field {field}: {reason}"))
