"""glue.config: one table of settings, read from the environment, update() and override()."""
import logging

import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.settings import FLAGS, config


def test_precedence_override_update_environment_default(monkeypatch):
    assert config.cpu_parallel_threshold == FLAGS["cpu_parallel_threshold"].default
    monkeypatch.setenv("GLUE_CPU_PARALLEL_THRESHOLD", "123")
    assert config.cpu_parallel_threshold == 123
    with config.override(cpu_parallel_threshold=7):
        assert config.cpu_parallel_threshold == 7
    assert config.cpu_parallel_threshold == 123


def test_jax_spellings_are_aliases():
    with config.override(jax_enable_x64=True):
        assert config.enable_x64 is True
    assert glue.config is config


def test_bad_values_are_glue_errors_naming_the_variable(monkeypatch):
    monkeypatch.setenv("GLUE_CPU_THREADS", "abc")
    with pytest.raises(glue.GlueError, match="GLUE_CPU_THREADS='abc'"):
        config.cpu_threads
    with pytest.raises(glue.GlueError, match="has no setting 'no_such'"):
        config.update("no_such", 1)
    with pytest.raises(glue.GlueError, match="expected one of"):
        config.update("gemm", "fastest")


def test_every_setting_is_described():
    text = config.describe()
    assert all(f"{name} = " in text for name in FLAGS)


def test_verify_checks_the_graph_after_every_pass():
    with config.override(verify=True):
        out = glue.jit(lambda x: gnp.exp(x * 1.0 + 0.0).sum(), backend="cpu")(np.ones(8, np.float32))
    assert float(out) == pytest.approx(8 * np.e, rel=1e-6)


def test_debug_levels_log_kernels_calls_stages_and_code(caplog):
    f = glue.jit(lambda x: gnp.tanh(x) + 1, backend="cpu")
    x = np.ones(4, np.float32)
    for level, wanted, unwanted in ((1, ["kernels", "to the results"], ["stage fusion"]),
                                    (2, ["stage fusion"], ["stage llvm"]), (3, ["stage llvm"], [])):
        caplog.clear()
        with config.override(debug=level), caplog.at_level(logging.DEBUG, logger="glue"):
            f.lower(x).compile()(x)
        text = caplog.text
        assert all(w in text for w in wanted), (level, text[:500])
        assert not any(u in text for u in unwanted), level
