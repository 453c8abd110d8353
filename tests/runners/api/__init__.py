"""The REST API of the fleet inventory: accelerators, clusters and node pools."""
