"""Hypothesis profiles: `ci` (the default under CI=true), `dev` and `thorough`; and the
`thorough` marker: a test of nightly size (gigabytes, minutes) runs only under that profile."""
import os

import pytest
from hypothesis import HealthCheck, settings

from glue.settings import config

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")

settings.register_profile("dev", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(PROFILE)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("thorough") and PROFILE != "thorough":
        pytest.skip("nightly size: runs under HYPOTHESIS_PROFILE=thorough")


@pytest.fixture
def x64():
    """64-bit types stay 64-bit in traced programs (JAX's jax_enable_x64), for the tests that
    use float64 / int64 on purpose; without it they narrow to 32 bits, as in JAX."""
    with config.override(enable_x64=True):
        yield
