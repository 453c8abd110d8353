"""Adversarial tests reuse the API fixtures (fleet, viewer, staff, submission, alpha/beta objects)."""

from tests.api.conftest import (  # noqa: F401
    alpha_objects,
    beta_objects,
    fleet,
    staff,
    submission,
    viewer,
)
