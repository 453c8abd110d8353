"""Example workloads for the ML control plane.

* :mod:`examples.gpt` -- a tiny byte-level GPT model and tokenizer.
* :mod:`examples.train_gpt` -- distributed (DDP) training script, runnable
  directly, under ``torchrun``, or under an external launcher that sets the
  standard ``MASTER_ADDR``/``RANK``/... environment.
* :mod:`examples.serve` -- stdlib-only HTTP inference server for the checkpoint
  written by ``train_gpt``.
* :mod:`examples.rl_grpo` -- GRPO fine-tuning of the GPT as a job of three roles:
  a learner and two rollouts exchanging weights and samples over HTTP.
* :mod:`examples.workload_metrics` -- progress reports in the platform's
  workload-metrics protocol, from any training script.
* ``examples/jobs/*.yaml`` -- control-plane job specs for them.
"""
