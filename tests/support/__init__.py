"""Shared test support, loaded for every test through ``pytest_plugins`` in ``tests/conftest.py``.

- ``personas``: the users the tests act as (owner, teammate, viewer, outsider, staff) with API and web clients;
- ``factories``: one builder per kind of test object (catalog, clusters, quotas, budgets, jobs, attempts) and
  the objects of teams alpha and beta;
- ``broker``: the Redis broker the on-commit tasks go to;
- ``states``: the job state machine's edges written by hand from docs/design.md, Job states, and event-chain checks;
- ``racing``: threads and scheduler processes racing on PostgreSQL;
- ``scheduling``: plain snapshots for the pure scheduling core (no database);
- ``kubernetes``: kmock Kubernetes emulators and a test-side kubelet, and ``ClusterEmulator``, a cluster that
  behaves like one (controllers, nodes, disruptions, injected faults);
- ``clusters``: two such clusters registered as the platform's (``live_clusters``) and the steps on them;
- ``synthetic_fleet`` and ``prometheus``: a generated GPU fleet served by a real Prometheus;
- ``local_runner``: the local runner's clusters under ``tmp_path`` and the cleanup of their processes.
"""
