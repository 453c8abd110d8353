"""``manage.py after_restore [--decide JOB=recover|fail ...] [--end-recovery]``: the restore step (ADR 0011).

Run once after the database was restored from a backup, before the workers
and beat start again (``platform/restore.md``): marks the installation
restored, adopts every attempt of this installation the clusters run or
recorded the end of that the database lost (``jobs.recovery.recover``), lists
what it cannot adopt, runs one reconcile pass (attempts ended in the gap end
as their end records say), then writes the ledger of the gap from the
objects' own times, every entry flagged ``reconstructed``
(``costs.ledger.reconstruct_gap``). Exits 1 when a cluster did not answer or
something is listed for staff (run it again once the cluster answers).

``--decide JOB=recover|fail`` is the staff decision on a job held because its
objects are gone without an end record; ``--end-recovery`` leaves recovery
mode (held attempts then follow the normal rule, ADR 0008).
"""

import json

from django.core.management.base import BaseCommand, CommandError

from costs.ledger import reconstruct_gap
from costs.rollups import totals_mismatches
from jobs.recovery import decide, end_recovery, recover


class Command(BaseCommand):
    help = ("After a restore of the database from a backup: adopt what the clusters run, end what ended in the "
            "gap as recorded, rebuild the gap's ledger (flagged), list what needs a staff decision.")

    def add_arguments(self, parser):
        parser.add_argument("--decide", action="append", default=[], metavar="JOB=recover|fail",
                            help="staff decision on a job held after the restore (repeatable)")
        parser.add_argument("--end-recovery", action="store_true", help="leave recovery mode")

    def handle(self, *args, **options):
        if options["decide"] or options["end_recovery"]:
            for item in options["decide"]:
                job_id, _, decision = item.partition("=")
                try:
                    self.stdout.write(f"job {job_id}: {decide(int(job_id), decision)}")
                except ValueError as exc:
                    raise CommandError(str(exc)) from exc
            if options["end_recovery"]:
                end_recovery()
                self.stdout.write("recovery mode ended")
            return
        result = recover()
        accrued = reconstruct_gap(result.restored_at)
        mismatches = totals_mismatches()
        self.stdout.write(json.dumps({
            "restored_at": result.restored_at.isoformat(),
            "recovery_point": result.recovery_point.isoformat() if result.recovery_point else None,
            "adopted": result.adopted, "listed_for_staff": result.listed, "unreachable": result.unreachable,
            "ledger_reconstructed_attempts": len(accrued), "totals_mismatches": len(mismatches),
        }, indent=2))
        if result.unreachable or result.listed or mismatches:
            raise CommandError("recovery is not complete: see unreachable clusters, listed attempts and totals above")
