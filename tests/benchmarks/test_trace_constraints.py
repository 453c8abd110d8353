"""The trace replay's constrained fill holds tasks to GPU models that could hold them, at the share asked, the same
way for the same seed; the reference placers keep a held task off other models' nodes."""

from __future__ import annotations

import random

from benchmarks.trace_replay import constrain, reference_fill

#: Two models: "old" nodes of 2 GPUs and 16 cores, "new" nodes of 8 GPUs and 96 cores.
NODES = [("o1", "old", 2, 16_000, 65_536), ("o2", "old", 2, 16_000, 65_536), ("n1", "new", 8, 96_000, 524_288)]


def test_held_tasks_name_only_models_able_to_hold_them_and_the_draw_is_fixed_by_its_seed():
    tasks = [(1, 4000, 8192)] * 400 + [(8, 64_000, 131_072)] * 100 + [(1, 32_000, 8192)] * 100
    held = constrain(NODES, tasks, random.Random(3), share=0.3)
    assert held == constrain(NODES, tasks, random.Random(3), share=0.3)
    models = [t[3] for t in held]
    # 8-GPU tasks and 32-core tasks fit only the new nodes; a 1-GPU 4-core task either model
    assert all(m in ("", "new") for m, t in zip(models, held, strict=True) if t[0] == 8 or t[1] == 32_000)
    small = [m for m, t in zip(models, held, strict=True) if t[:3] == (1, 4000, 8192) and m]
    assert {"old", "new"} == set(small)
    # about 30 % held: 180 expected of 600, binomial sd about 11
    assert 130 <= sum(1 for m in models if m) <= 230


def test_a_reference_placer_keeps_a_task_held_to_a_model_off_the_others():
    # two 2-GPU tasks held to "old", then one held to "old" again: the old nodes are full, the new node stays empty
    sequence = [(2, 1000, 1024, "old"), (2, 1000, 1024, "old"), (2, 1000, 1024, "old")]
    total = 12
    assert reference_fill(NODES, sequence, "best-fit", (6,)) == [4 / total]
    assert reference_fill(NODES, [(2, 1000, 1024, "")] * 3, "best-fit", (6,)) == [6 / total]
