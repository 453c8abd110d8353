"""A deterministic simulation of the whole control plane: the real code against emulated clusters, on a virtual
clock, with faults injected at random and named invariants checked after every step.

The parts:

- ``clock.VirtualClock``: one virtual time for the process (``time-machine``): ``timezone.now()``, ``time.time()``
  and the emulated clusters' own clocks all read it; it moves only when the simulation says so.
- ``world.World``: what one scenario runs on: emulated Kubernetes clusters (``tests.support.kubernetes
  .ClusterEmulator``: API server, Job and Deployment controllers, binding, pod GPU-second counting) registered as
  the platform's clusters, two teams in a cohort, prices; the platform's own code does all the work: submissions
  and cancels go through the REST API, the tasks it publishes land in Celery's in-memory broker, and the
  simulated worker delivers them (at least once, in an order the scenario chooses, a retried task not before its
  countdown), beat publishes the periodic tasks of ``CELERY_BEAT_SCHEDULE`` on the virtual clock.
- ``scenario``: a scenario is a list of actions (tuples) drawn from one seed; faults are actions too, each
  kind drawn at its rate (``Knobs``). ``play(config, actions)`` plays them, checks every invariant after each
  step, then stops the faults, lets the platform settle and checks the end invariants. ``shrink`` removes
  actions while the same invariant still breaks (delta debugging), so a violation is reported as its seed and
  the shortest action list found.
- ``invariants``: each invariant is a function with a name (``STEP``, ``END``, ``NAMES``); a violation names it.
- ``regressions``: every class of failure found, as its shortest world and action list (``REGRESSIONS``).

``benchmarks/simulate.py`` runs many seeds; ``tests/simulation`` runs a bounded number and the regression
scenarios of every class of failure the simulation found.
"""
