"""``manage.py ensure_local_cluster``: record this machine (NVML GPUs or emulated ones) as the local cluster."""

from django.core.management.base import BaseCommand

from runners.local.capacity import ensure_local_cluster


class Command(BaseCommand):
    """Create or update the local cluster, its node pool and its price override (idempotent)."""

    help = "Create or update the local cluster (NVIDIA GPUs via NVML, else emulated GPUs), its node pool and price."

    def handle(self, *args, **options) -> None:
        """Run ``ensure_local_cluster`` and print the cluster and its pools."""
        cluster = ensure_local_cluster()
        kind = "emulated GPUs, jobs run on the CPU" if cluster.emulated else "NVIDIA GPUs"
        self.stdout.write(f"cluster {cluster.name} ({kind})")
        for pool in cluster.node_pools.select_related("accelerator"):
            self.stdout.write(f"  pool {pool.name}: {pool.nodes} nodes x {pool.gpus_per_node} {pool.accelerator.name}")
