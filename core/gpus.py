"""GPU shares: the milli-GPU unit in which fractions of a GPU are asked, booked, counted against quotas and billed,
and NVIDIA's table of MIG profiles per accelerator (ADR 0040).

Pure data and arithmetic on integers and Decimals, no database: every app may import it.
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal, InvalidOperation

#: Milli-GPUs in one GPU: shares are integers of this unit, so sums and comparisons are exact (no float drift: a
#: request equal to what is left is admitted).
MILLI_PER_GPU = 1000
#: The finest fraction of a GPU a job may ask (0.01 GPU), in milli-GPUs.
SHARE_STEP_MILLI = 10


def milli_of(gpus) -> int:
    """A GPU amount (int, Decimal, a decimal string or a float as written, e.g. ``0.25``) in milli-GPUs, exactly.

    Raises ValueError when the amount is not a number or is not a whole multiple of ``SHARE_STEP_MILLI`` (0.01 GPU):
    ``0.333`` is refused, never rounded.
    """
    try:
        exact = Decimal(str(gpus)) * MILLI_PER_GPU
    except (InvalidOperation, ValueError, TypeError) as exc:
        raise ValueError(f"{gpus!r} is not a number of GPUs") from exc
    if not exact.is_finite() or exact != exact.to_integral_value() or int(exact) % SHARE_STEP_MILLI:
        raise ValueError(f"{gpus} GPUs is not a multiple of {Decimal(SHARE_STEP_MILLI) / MILLI_PER_GPU} GPU")
    return int(exact)


def gpus_of(milli: int) -> Decimal:
    """Milli-GPUs as a Decimal number of GPUs (``250`` -> ``Decimal("0.25")``, ``2000`` -> ``Decimal("2")``)."""
    return (Decimal(milli) / MILLI_PER_GPU).normalize() if milli % MILLI_PER_GPU else Decimal(milli // MILLI_PER_GPU)


def exact_gpus(milli: int) -> int | Decimal:
    """Milli-GPUs as the number of GPUs quotas count: an ``int`` when whole (``2000`` -> ``2``), else an exact
    Decimal (``250`` -> ``Decimal("0.25")``). Whole-GPU usage stays integer arithmetic; a share adds exactly, so a
    request equal to what is left compares equal (no float drift)."""
    return milli // MILLI_PER_GPU if milli % MILLI_PER_GPU == 0 else gpus_of(milli)


def shown_gpus(gpus) -> int | float:
    """A GPU amount (int or Decimal) as a JSON number for messages and API details: an int when whole
    (``Decimal("1.00")`` -> ``1``), else a float (``Decimal("0.25")`` -> ``0.25``); never used in arithmetic."""
    return int(gpus) if gpus == int(gpus) else float(gpus)


#: How a node's GPUs are shared (``runners.base.NodeInfo.sharing``, ``runners.Node.gpu_sharing``): the NVIDIA device
#: plugin's ``nvidia.com/gpu.sharing-strategy`` values (none, time-slicing, mps) and GPU feature discovery's
#: ``nvidia.com/mig.strategy`` values (single, mixed) as ``mig-single`` and ``mig-mixed``.
SHARING_MODES = ("none", "time-slicing", "mps", "mig-single", "mig-mixed")


# --- MIG profiles ----------------------------------------------------------------------------------------------

#: Where ``MIG_PROFILES`` comes from: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles" (the A100 table,
#: with its note that A100-SXM4-80GB renames each profile by its memory; the H100 table).
MIG_SOURCE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"
#: Compute slices and memory slices of a whole GA100 / GH100 GPU (the denominators of that table's "Fraction of
#: SMs" and "Fraction of Memory" columns).
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8


@dataclasses.dataclass(frozen=True)
class MigProfile:
    """One MIG profile of an accelerator as NVIDIA's table gives it: ``name`` (``1g.10gb``), compute slices out of
    ``MIG_COMPUTE_SLICES``, memory slices out of ``MIG_MEMORY_SLICES``, memory (GB) and the most instances of it one
    GPU holds (``instances``).

    ``share_milli``: the share of its GPU it is booked and billed as, in milli-GPUs: its memory slices over the
    GPU's eight (1/8 = 125). Memory is the resource a MIG instance holds exclusively and the one the table counts
    in eighths, so every share is an exact integer; compute sevenths are not (1/7 GPU = 142.857...).
    """

    name: str
    compute_slices: int
    memory_slices: int
    memory_gb: int
    instances: int

    @property
    def share_milli(self) -> int:
        return self.memory_slices * MILLI_PER_GPU // MIG_MEMORY_SLICES

    @property
    def resource(self) -> str:
        """The Kubernetes extended resource the device plugin advertises it as under the mixed strategy."""
        return f"nvidia.com/mig-{self.name}"


def _profiles(*rows: tuple[str, int, int, int, int]) -> dict[str, MigProfile]:
    return {row[0]: MigProfile(*row) for row in rows}


#: MIG profiles per accelerator (``runners.Accelerator.name``), from ``MIG_SOURCE``: (name, compute slices, memory
#: slices, memory GB, instances per GPU). The media-extension profiles (``+me``) are left out: the device plugin
#: does not advertise them as a resource of their own name.
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _profiles(("1g.5gb", 1, 1, 5, 7), ("1g.10gb", 1, 2, 10, 4), ("2g.10gb", 2, 2, 10, 3),
                           ("3g.20gb", 3, 4, 20, 2), ("4g.20gb", 4, 4, 20, 1), ("7g.40gb", 7, 8, 40, 1)),
    "A100-80GB": _profiles(("1g.10gb", 1, 1, 10, 7), ("1g.20gb", 1, 2, 20, 4), ("2g.20gb", 2, 2, 20, 3),
                           ("3g.40gb", 3, 4, 40, 2), ("4g.40gb", 4, 4, 40, 1), ("7g.80gb", 7, 8, 80, 1)),
    "H100-80GB": _profiles(("1g.10gb", 1, 1, 10, 7), ("1g.20gb", 1, 2, 20, 4), ("2g.20gb", 2, 2, 20, 3),
                           ("3g.40gb", 3, 4, 40, 2), ("4g.40gb", 4, 4, 40, 1), ("7g.80gb", 7, 8, 80, 1)),
}

#: ``nvidia.com/gpu.product`` values of the accelerators of ``MIG_PROFILES`` (GPU feature discovery's product
#: names, SXM and PCIe), so node discovery finds a MIG node's table before its accelerator row is known.
MIG_PRODUCTS: dict[str, str] = {
    "NVIDIA-A100-SXM4-40GB": "A100-40GB", "NVIDIA-A100-PCIE-40GB": "A100-40GB", "A100-SXM4-40GB": "A100-40GB",
    "NVIDIA-A100-SXM4-80GB": "A100-80GB", "NVIDIA-A100-80GB-PCIe": "A100-80GB", "A100-SXM4-80GB": "A100-80GB",
    "NVIDIA-H100-80GB-HBM3": "H100-80GB", "NVIDIA-H100-PCIe": "H100-80GB",
}


def mig_profile(accelerator: str, name: str) -> MigProfile | None:
    """The MIG profile ``name`` of ``accelerator`` (an accelerator name), or None when the table has no such pair."""
    return MIG_PROFILES.get(accelerator, {}).get(name)


def mig_gpus(product: str, profile: str, devices: int) -> int:
    """Physical GPUs behind ``devices`` MIG devices of ``profile`` on a node of GPU product ``product`` (the base
    ``nvidia.com/gpu.product``) under the single strategy, where every GPU is cut alike: ``devices`` over the
    instances one GPU holds of that profile (``MIG_PROFILES``), rounded up; for a product or profile the table does
    not know, over ``MIG_COMPUTE_SLICES`` (the most instances any GPU holds), so physical GPUs are never counted
    more than they can be."""
    known = mig_profile(MIG_PRODUCTS.get(product, ""), profile)
    return math.ceil(devices / (known.instances if known else MIG_COMPUTE_SLICES)) if devices > 0 else 0
