"""A job on part of a GPU, or on a whole one, says what it holds and works for a while (standard library only).

Prints one line ``holds sharing=<mode> share=<GPUs> node=<node> gpu=<index> mig_profile=<profile>
mig_instance=<GPU_I_ID> cuda_visible_devices=<value>`` from the variables the runner sets (``CONTROLPLANE_GPU_*``,
``CONTROLPLANE_MIG_*``: ADR 0040; a whole GPU has ``sharing=none share=whole``), then computes for ``--seconds``
(default 15) at ``--duty`` of one core (default 0.5: busy half of every 100 ms, idle the rest: what an emulated GPU's
exporter reports as utilization), and prints ``done after <s> s``.
"""

from __future__ import annotations

import argparse
import os
import time


def holds(env: dict[str, str]) -> str:
    """The ``holds ...`` line of the environment ``env``."""
    fields = {"sharing": env.get("CONTROLPLANE_GPU_SHARING") or "none",
              "share": env.get("CONTROLPLANE_GPU_SHARE") or "whole",
              "node": env.get("CONTROLPLANE_GPU_NODE") or "-", "gpu": env.get("CONTROLPLANE_GPU_INDEX") or "-",
              "mig_profile": env.get("CONTROLPLANE_MIG_PROFILE") or "-",
              "mig_instance": env.get("CONTROLPLANE_MIG_INSTANCE") or "-",
              "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES") or "-"}
    return "holds " + " ".join(f"{k}={v}" for k, v in fields.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--duty", type=float, default=0.5)
    args = parser.parse_args(argv)
    print(holds(dict(os.environ)), flush=True)
    start = time.monotonic()
    while time.monotonic() - start < args.seconds:
        tick = time.monotonic()
        while time.monotonic() - tick < 0.1 * args.duty:
            pass
        time.sleep(max(0.0, 0.1 * (1 - args.duty)))
    print(f"done after {time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
