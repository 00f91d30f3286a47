"""The backend contract: one staged lowering for every backend, raw buffers in and out, lowering
for cuda without a GPU, and JAX's donation contract on every backend."""
import numpy as np
import pytest

import glue
import glue.numpy as gnp
from glue.backend import available_backends, get_backend
from glue.backend_cuda import CudaBackend
from glue.settings import config

BACKENDS = [b for b in ("reference", "cpu", "cuda") if b in available_backends()]


def test_every_backend_lowers_through_one_stage_table():
    x = np.ones((4, 8), np.float32)
    for name, extra in (("cpu", ("llvm", "asm")), ("cuda", ("llvm", "ptx")), ("reference", ())):
        low = glue.jit(lambda x: gnp.exp(x).sum(-1), backend=name).lower(x)
        scheduler = () if name == "reference" else ("optimized", "fusion", "kernels", "streams", "memory", "graph")
        assert low.stages == ("ir",) + scheduler + extra, name
        for stage in low.stages:
            assert isinstance(low.as_text(stage), str) and low.as_text(stage)


def test_cuda_lowers_and_prints_ptx_without_a_gpu_for_any_arch():
    x = np.ones((64, 64), np.float32)
    for arch in ("sm_80", "sm_90"):
        low = glue.jit(lambda x: gnp.tanh(x) * 2, backend="cuda", backend_options={"arch": arch}).lower(x)
        assert f".target {arch}" in low.as_text("ptx")
    with config.override(arch="sm_86"):
        assert ".target sm_86" in glue.jit(lambda x: x + 1, backend="cuda").lower(x).as_text("ptx")


@pytest.mark.skipif(CudaBackend.can_run(), reason="checks the error where no GPU is")
def test_compiling_for_cuda_without_a_gpu_says_why():
    f = glue.jit(lambda x: x + 1, backend="cuda")
    with pytest.raises(glue.GlueError, match=r"cannot run programs here \(no NVIDIA GPU and driver\).*ptx"):
        f(np.ones(3, np.float32))


def test_unknown_arch_and_options_are_glue_errors():
    graph = glue.make_ir(lambda x: x + 1)(np.ones(3, np.float32)).graph
    with pytest.raises(glue.GlueError, match="no PTX target for arch 'sm_12'"):
        CudaBackend().lower(graph, arch="sm_12")
    with pytest.raises(glue.GlueError, match="bad options"):
        get_backend("cpu").lower(graph, tile=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_executables_take_and_give_raw_buffers(backend):
    exe = get_backend(backend).lower(glue.make_ir(lambda x: x * 3)(np.ones(5, np.float32)).graph).compile()
    (out,) = exe(np.arange(5, dtype=np.float32))
    assert not isinstance(out, glue.Array)
    np.testing.assert_array_equal(np.asarray(glue.Array(out)), np.arange(5) * 3)
    assert exe.memory_analysis().argument_bytes == 20
    assert exe.cost_analysis().flops >= 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_donated_numpy_argument_is_never_written(backend):
    x = np.arange(8, dtype=np.float32)
    f = glue.jit(lambda x: x + 1.0, backend=backend, donate_argnums=0)
    y1, y2 = f(x), f(x)
    np.testing.assert_array_equal(x, np.arange(8))
    np.testing.assert_array_equal(np.asarray(y1), np.arange(8) + 1)
    np.testing.assert_array_equal(np.asarray(y2), np.arange(8) + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_donated_array_is_deleted_and_its_use_names_the_call(backend):
    f = glue.jit(lambda x: x * 2.0, backend=backend, donate_argnums=0)
    x = glue.device_put(np.arange(4, dtype=np.float32), backend)
    y = f(x)
    assert x.is_deleted and "deleted" in repr(x)
    np.testing.assert_array_equal(np.asarray(y), [0, 2, 4, 6])
    with pytest.raises(glue.GlueError, match=r"donated to <lambda> .* and deleted"):
        f(x)
    with pytest.raises(glue.GlueError, match="donated"):
        np.asarray(x)
    z = f(y)  # the result of a donating call can be donated again
    np.testing.assert_array_equal(np.asarray(z), [0, 4, 8, 12])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_array_donated_and_read_twice_in_one_call(backend):
    f = glue.jit(lambda a, b: a * 2.0 + b, backend=backend, donate_argnums=0)
    x = glue.device_put(np.arange(4, dtype=np.float32), backend)
    out = f(x, x)
    np.testing.assert_array_equal(np.asarray(out), np.arange(4) * 3)
    assert x.is_deleted


def test_argnums_are_checked_like_jax():
    def f(a, b, c):
        return a + b * c

    with pytest.raises(glue.GlueError, match=r"static_argnums 5 is out of range: f takes 3 positional"):
        glue.jit(f, static_argnums=5)
    with pytest.raises(glue.GlueError, match=r"donate_argnums 3 is out of range"):
        glue.jit(f, donate_argnums=3)
    with pytest.raises(glue.GlueError, match="in both static_argnums and donate_argnums"):
        glue.jit(f, static_argnums=1, donate_argnums=-2)
    with pytest.raises(glue.GlueError, match="must be ints"):
        glue.jit(f, static_argnums="b")
    g = glue.jit(f, static_argnums=-1)  # the last positional parameter, as JAX counts
    assert float(g(np.float32(1), np.float32(2), 3)) == 7.0
    with pytest.raises(glue.GlueError, match="static_argnums names position 2"):
        g(np.float32(1), np.float32(2))


def test_an_unwritable_dump_directory_is_a_glue_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with config.override(dump=str(blocker / "dump")):
        with pytest.raises(glue.GlueError, match="GLUE_DUMP: cannot write the stages"):
            glue.jit(lambda x: x + 1, backend="cpu")(np.ones(3, np.float32))


def test_compile_stats_time_every_stage_and_kernel():
    def f(x):
        return gnp.exp(x) * 2, (x * x).sum()

    x = np.ones((5, 29), np.float32)  # a shape no other test compiles: every kernel is built
    with config.override(cache_dir=""):
        compiled = glue.jit(f, backend="cpu").lower(x).compile()
        again = glue.jit(f, backend="cpu").lower(x).compile()
    stats = compiled.compile_stats()
    assert ["trace", "passes", "fuse", "plan", "program", "object", "load"] == [
        s for s in stats["stages"] if s in ("trace", "passes", "fuse", "plan", "program", "object", "load")]
    assert all(s["seconds"] >= 0 for s in stats["stages"].values())
    assert stats["seconds"] == pytest.approx(sum(s["seconds"] for s in stats["stages"].values()))
    kernels = stats["kernels"]
    assert len(kernels) == len(compiled.kernels) == 2 and stats["cache"] == {"built": 2, "disk": 0, "memory": 0}
    for k in kernels:
        assert k["source"] == "built" and k["uses"] == 1
        assert {"llvm build", "llvm optimise", "object emission", "link"} <= set(k["seconds"])
    assert set(stats["steps"]) >= {"llvm build", "llvm optimise", "object emission", "link"}
    # the same kernels again, while the first program lives: this process's memory serves them
    assert again.compile_stats()["cache"] == {"built": 0, "disk": 0, "memory": 2}
    assert again.compile_stats()["stages"]["object"]["cached"]
