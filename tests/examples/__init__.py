"""The example workloads and the checkpoint store they use (no Django models needed)."""
