"""Tests marked `cuda` need an NVIDIA GPU with its driver; they are skipped anywhere else."""
import pytest

from glue.backend_cuda import CudaBackend


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") and not CudaBackend.can_run():
        pytest.skip("needs an NVIDIA GPU and driver")
