"""Hypothesis profiles: `ci` (the default under CI=true), `dev` and `thorough`."""
import os

import pytest
from hypothesis import HealthCheck, settings

from glue.settings import config

settings.register_profile("dev", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture
def x64():
    """64-bit types stay 64-bit in traced programs (JAX's jax_enable_x64), for the tests that
    use float64 / int64 on purpose; without it they narrow to 32 bits, as in JAX."""
    with config.override(enable_x64=True):
        yield
