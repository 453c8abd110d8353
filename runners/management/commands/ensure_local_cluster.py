"""``manage.py ensure_local_cluster``: record this machine (NVML GPUs or emulated ones) as the local cluster."""

from django.core.management.base import BaseCommand

from runners.local.capacity import ensure_local_cluster, machine_resources


class Command(BaseCommand):
    """Create or update the local cluster, its GPU and CPU node pools and their price overrides (idempotent)."""

    help = ("Create or update the local cluster (NVIDIA GPUs via NVML, else emulated GPUs; and this machine's CPUs "
            "as a CPU pool), its node pools and prices.")

    def handle(self, *args, **options) -> None:
        """Run ``ensure_local_cluster`` and print the cluster and its pools."""
        cluster = ensure_local_cluster()
        kind = "emulated GPUs, jobs run on the CPU" if cluster.emulated else "NVIDIA GPUs"
        self.stdout.write(f"cluster {cluster.name} ({kind})")
        cpu_milli, memory_mib = machine_resources()
        for pool in cluster.node_pools.select_related("accelerator"):
            if pool.accelerator.is_cpu:
                self.stdout.write(f"  pool {pool.name}: {pool.nodes} nodes of {cpu_milli // 1000} vCPUs and "
                                  f"{memory_mib // 1024} GiB (CPU-only jobs)")
            else:
                self.stdout.write(f"  pool {pool.name}: {pool.nodes} nodes x {pool.gpus_per_node} "
                                  f"{pool.accelerator.name}")
