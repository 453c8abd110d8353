"""``manage.py dcgm_shape CLUSTER [--detect] [--set pod|exported_pod|host | --clear]``: a cluster's DCGM label shape.

Prints the shape in force, whether it was detected or set, and the utilization counter. ``--detect`` reads the
cluster's series now; ``--set`` overrides the detection; ``--clear`` removes the override. Exits 2 on an unknown
cluster or shape.
"""

from django.core.management.base import BaseCommand, CommandError

from costs.collection import detect_cluster_shape
from costs.models import ClusterMetrics
from runners.models import Cluster


class Command(BaseCommand):
    help = "Show, detect or override how a cluster's DCGM series are attributed to pods (label shape)."

    def add_arguments(self, parser):
        parser.add_argument("cluster")
        parser.add_argument("--detect", action="store_true", help="read the cluster's series now")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--set", choices=ClusterMetrics.Shape.values, help="override the detected shape")
        group.add_argument("--clear", action="store_true", help="remove the override")

    def handle(self, *args, cluster, detect=False, set=None, clear=False, **options):
        target = Cluster.objects.filter(name=cluster).first()
        if target is None:
            raise CommandError(f"cluster: no cluster named {cluster!r}", returncode=2)
        if detect and detect_cluster_shape(target) is None:
            raise CommandError(f"cluster: {cluster} has no Prometheus to read", returncode=2)
        row, _ = ClusterMetrics.objects.get_or_create(cluster=target)
        if set or clear:
            row.shape_override = set or ""
            row.save(update_fields=["shape_override"])
        origin = "set by an operator" if row.shape_override else f"detected {row.detected_at or 'never'}"
        self.stdout.write(f"{cluster}: {row.shape or 'unknown'} ({origin}); counter {row.util_metric or 'none seen'}")
