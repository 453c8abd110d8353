"""Example workloads for the ML control plane.

* :mod:`examples.gpt` -- a tiny byte-level GPT model and tokenizer.
* :mod:`examples.train_gpt` -- distributed (DDP) training script, runnable
  directly, under ``torchrun``, or under an external launcher that sets the
  standard ``MASTER_ADDR``/``RANK``/... environment.
* :mod:`examples.serve` -- stdlib-only HTTP inference server for the checkpoint
  written by ``train_gpt``.
* ``examples/jobs/*.yaml`` -- control-plane job specs for both.
"""
