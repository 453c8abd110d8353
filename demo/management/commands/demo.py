"""``manage.py demo [--once]``: the main job end to end on embedded defaults (see demo.run)."""

from django.core.management.base import BaseCommand, CommandError

from demo.run import PortInUse, run_demo


class Command(BaseCommand):
    help = "Seed, start web + Celery worker + beat, submit a PyTorch training job through the API, follow it, charge it."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="exit when the demo jobs are final (status 0 on success)")
        parser.add_argument("--port", type=int, default=8000, help="web server port on 127.0.0.1 (default 8000)")
        parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
        parser.add_argument("--nodes", type=int, default=2, help="processes (nodes) of the training job (default 2)")
        parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the jobs (default 900)")

    def handle(self, *args, **opts):
        try:
            code = run_demo(once=opts["once"], port=opts["port"], steps=opts["steps"], nodes=opts["nodes"],
                            timeout=opts["timeout"], out=self.stdout)
        except PortInUse as exc:  # a one-line message and exit status 1, not a traceback
            raise CommandError(str(exc)) from exc
        if code:
            raise SystemExit(code)
