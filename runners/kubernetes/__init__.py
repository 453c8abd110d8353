"""The ``kubernetes`` backend: Jobs, Deployments and Services on real clusters through the official client.

``client`` holds one configured, rate-limited API client per cluster,
``manifests`` builds the objects (pure), ``runner`` implements the contract.
"""
