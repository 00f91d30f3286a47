"""The CUDA runtime: error translation, availability and devices (anywhere), and on a GPU:
transfers, launches, the caching allocator, the module cache, streams and events."""
import ctypes
import re
import struct
import threading
import types

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.settings import config
from glue.backend_cuda import CudaBackend, detected_arch
from glue.backend_cuda.ptx import ptx_for_module
from glue.backend_cuda.runtime import DeviceBuffer, Event, Stream, driver as drv, get_context, transfer
from glue.backend_cuda.runtime.allocator import CachingAllocator, size_class
from glue.backend_cuda.runtime.module import ArgPack, Kernel, ModuleCache, Param, whole_program
from glue.errors import BackendError, GlueError
from glue.ir import dtypes as dt
from tests.backend_cuda.kernels import axpy_ir

cuda_bindings = pytest.importorskip("cuda.bindings.driver")
CUresult = cuda_bindings.CUresult


# ---- anywhere -------------------------------------------------------------------------------

@given(st.sampled_from([c for c in CUresult if c != CUresult.CUDA_SUCCESS]))
def test_every_error_code_becomes_a_backend_error_naming_call_and_kernel(code):
    err = drv.error_for("cuLaunchKernel", code, kernel="fused_add_tanh")
    assert isinstance(err, BackendError) and isinstance(err, GlueError)
    assert err.code == int(code) and err.code_name == code.name
    assert "cuLaunchKernel" in str(err) and "'fused_add_tanh'" in str(err) and code.name in str(err)


def test_error_codes_map_to_subclasses():
    assert type(drv.error_for("cuMemAlloc", CUresult.CUDA_ERROR_OUT_OF_MEMORY)) is drv.CudaOutOfMemoryError
    assert type(drv.error_for("cuLaunchKernel", CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)) is drv.CudaLaunchError
    assert type(drv.error_for("cuLinkAddData", CUresult.CUDA_ERROR_INVALID_PTX)) is drv.CudaCompileError
    assert type(drv.error_for("cuCtxSynchronize", CUresult.CUDA_ERROR_INVALID_VALUE)) is drv.CudaError
    assert "restart" in str(drv.error_for("cuStreamSynchronize", CUresult.CUDA_ERROR_ILLEGAL_ADDRESS))


def test_check_returns_the_values_or_raises():
    ok = CUresult.CUDA_SUCCESS
    assert drv.check((ok,), "f") is None
    assert drv.check((ok, 7), "f") == 7
    assert drv.check((ok, 7, 8), "f") == (7, 8)
    with pytest.raises(drv.CudaError, match="cuFoo failed.*CUDA_ERROR_NOT_READY"):
        drv.check((CUresult.CUDA_ERROR_NOT_READY, None), "cuFoo")


def test_missing_driver_means_unavailable_not_an_exception(monkeypatch):
    from cuda.pathfinder import DynamicLibNotFoundError

    def cu_init(flags):
        raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library')

    monkeypatch.setattr(drv, "_bindings", lambda: types.SimpleNamespace(cuInit=cu_init, CUresult=CUresult))
    drv.load.cache_clear()
    try:
        assert CudaBackend.can_run() is False
        assert drv.device_count() == 0
        with pytest.raises(drv.CudaUnavailableError, match="cannot be loaded"):
            drv.load()
    finally:
        monkeypatch.undo()
        drv.load.cache_clear()


def test_is_available_is_a_bool_and_lowering_needs_no_gpu():
    assert isinstance(CudaBackend.can_run(), bool)
    assert CudaBackend.name == "cuda"
    closed = glue.make_ir(lambda x: x * 2)(np.ones(4, np.float32))
    assert ".entry" in CudaBackend().lower(closed.graph, name="f").as_text("ptx")


def test_devices_list_gpus_then_the_cpu():
    devices = glue.devices()
    assert devices[-1].platform == "cpu" and devices[-1].memory_bytes > 0 and devices[-1].arch is None
    gpus = devices[:-1]
    assert len(gpus) == drv.device_count()
    assert all(d.platform == "cuda" and d.arch.startswith("sm_") for d in gpus)


@given(st.integers(0, 1 << 40))
def test_size_classes_cover_the_request_and_waste_little(n):
    c = size_class(n)
    assert c >= n and c % 512 == 0
    assert c - n <= 512 or c - n <= n / 8
    assert size_class(c) == c


@given(st.lists(st.sampled_from(["ptr", "u8", "u16", "s32", "f32", "u64", "f64"]), max_size=10),
       st.data())
def test_arg_pack_points_each_slot_at_its_value(kinds, data):
    fmt = {"ptr": "Q", "u8": "B", "u16": "H", "s32": "i", "f32": "f", "u64": "Q", "f64": "d"}
    params = [Param("u64", True) if k == "ptr" else Param(k) for k in kinds]
    values = [data.draw(st.integers(0, 2**64 - 1) if fmt[k] == "Q" else
                        st.integers(0, 255) if k == "u8" else st.integers(0, 65535) if k == "u16" else
                        st.integers(-2**31, 2**31 - 1) if k == "s32" else
                        st.floats(width=32 if k == "f32" else 64, allow_nan=False)) for k in kinds]
    pack = ArgPack(params)
    pack.pack([types.SimpleNamespace(ptr=v) if k == "ptr" else v for k, v in zip(kinds, values)])
    argv = (ctypes.c_void_p * len(kinds)).from_address(pack.address) if kinds else []
    for slot, kind, value in zip(argv, kinds, values):
        size = struct.calcsize(fmt[kind])
        assert struct.unpack(fmt[kind], ctypes.string_at(slot, size))[0] == value
        assert slot % size == 0


# ---- on a GPU -------------------------------------------------------------------------------

def random_array(rng: np.random.Generator, dtype: dt.DType, shape: tuple) -> np.ndarray:
    if dtype.kind == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind == "int":
        info = np.iinfo(dtype.numpy)
        return np.asarray(rng.integers(info.min, info.max, size=shape, dtype=dtype.numpy, endpoint=True))
    return np.asarray(rng.standard_normal(shape) * 100).astype(dtype.numpy)


@pytest.fixture(scope="module")
def ctx():
    return get_context()


@pytest.fixture(scope="module")
def axpy(ctx) -> Kernel:
    return ctx.modules.load(ptx_for_module(axpy_ir(), ctx.device.arch)).get_function("axpy")


POISON_F32 = np.uint32(0xFFFFFFFF).view(np.float32)


@pytest.mark.cuda
@settings(max_examples=30)
@given(st.sampled_from(dt.ALL_DTYPES), st.lists(st.integers(0, 9), max_size=3), st.integers(0, 2**32 - 1))
def test_round_trip_of_every_dtype(dtype, shape, seed):
    host = random_array(np.random.default_rng(seed), dtype, tuple(shape))
    buf = DeviceBuffer.from_numpy(host)
    assert buf.shape == host.shape and buf.dtype == dtype and buf.nbytes == host.nbytes
    back = buf.to_host()
    assert back.dtype == host.dtype and back.shape == host.shape
    assert back.tobytes() == host.tobytes()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n", [100_000, 3_000_001])  # one staging buffer; chunks (12 MB in f32)
def test_round_trip_through_pinned_staging(dtype, n):
    host = np.random.default_rng(1).standard_normal(n).astype(dtype)
    assert host.nbytes > transfer.DIRECT_MAX
    assert np.array_equal(DeviceBuffer.from_numpy(host).to_host().view(np.uint8), host.view(np.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1000, 100_000])  # direct and staged
def test_upload_copies_the_source_before_returning(n):
    host = np.arange(n, dtype=np.float32)
    buf = DeviceBuffer.from_numpy(host)
    host[:] = -1
    assert np.array_equal(buf.to_host(), np.arange(n, dtype=np.float32))


@pytest.mark.cuda
@settings(max_examples=15, deadline=None)
@given(st.integers(1, 300), st.integers(0, 5000))
def test_a_repeating_upload_fills_exactly_its_bytes_with_the_pattern(pattern_size, nbytes):
    pattern = np.random.default_rng(pattern_size).integers(0, 256, pattern_size, dtype=np.uint8)
    buf = DeviceBuffer((5008,), dt.uint8).fill_bytes(0xEE)
    transfer.upload_repeating(buf.ptr, pattern, nbytes, buf.stream)
    buf.mark_written()
    got = buf.to_host()
    assert np.array_equal(got[:nbytes], np.resize(pattern, nbytes))
    assert (got[nbytes:] == 0xEE).all()


@pytest.mark.cuda
def test_narrow_numpy_dtypes_are_stored_as_their_glue_dtype():
    buf = DeviceBuffer.from_numpy(np.array([1, -2, 3], dtype=np.int8))
    assert buf.dtype == dt.int8 and buf.to_host().tolist() == [1, -2, 3]


def launch_axpy(axpy, x, y, out, alpha, n, stream=None, **kw):
    """Queue axpy after its buffers' last writes, as a program call does: a raw launch is not
    ordered after `from_numpy`'s upload on the copy stream (it read stale inputs on an H100)."""
    stream = stream or axpy.module.ctx.stream
    for buf in (x, y, out):
        buf.prepare_for(stream)
    axpy.launch((n + 127) // 128, 128, (x, y, out, alpha, n), stream, **kw)
    out.mark_written(stream)


@pytest.mark.cuda
@settings(max_examples=20)
@given(st.integers(1, 5000), st.floats(-4, 4, width=32), st.integers(0, 2**32 - 1))
def test_elementwise_kernel_matches_numpy_and_writes_only_its_range(axpy, n, alpha, seed):
    rng = np.random.default_rng(seed)
    xh, yh = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y = DeviceBuffer.from_numpy(xh), DeviceBuffer.from_numpy(yh)
    out = DeviceBuffer((n + 37,), np.float32).fill_bytes(0xFF)
    launch_axpy(axpy, x, y, out, alpha, n)
    got = out.to_host()
    expected = np.float32(alpha) * xh + yh
    assert not np.isnan(got[:n]).any(), "unwritten outputs"
    np.testing.assert_allclose(got[:n], expected, rtol=1e-6, atol=1e-6)
    assert got[n:].view(np.uint32).tolist() == [0xFFFFFFFF] * 37, "wrote past n"


@pytest.mark.cuda
def test_poison_fill(ctx):
    buf = DeviceBuffer((5,), np.int32).fill_bytes(0xFF)
    assert buf.to_host().tolist() == [-1] * 5


@pytest.mark.cuda
def test_bound_pack_and_big_dynamic_shared_memory(ctx, axpy):
    n = 1000
    xh = np.linspace(-1, 1, n, dtype=np.float32)
    x, y = DeviceBuffer.from_numpy(xh), DeviceBuffer.from_numpy(np.ones(n, np.float32))
    out = DeviceBuffer((n,), np.float32).fill_bytes(0xFF)
    pack = axpy.bind((x, y, out, 3.0, n))
    axpy.launch_packed(pack, (8, 1, 1), (128, 1, 1), ctx.stream, shared_mem=100_000)
    out.mark_written()
    np.testing.assert_allclose(out.to_host(), 3 * xh + 1, rtol=1e-6)
    attrs = axpy.attributes()
    assert attrs["registers"] > 0 and attrs["local_bytes"] == 0


@pytest.mark.cuda
def test_launch_from_another_host_thread(ctx, axpy):
    n = 300
    x = DeviceBuffer.from_numpy(np.arange(n, dtype=np.float32))
    y = DeviceBuffer.from_numpy(np.zeros(n, np.float32))
    out = DeviceBuffer((n,), np.float32).fill_bytes(0xFF)
    for buf in (x, y, out):  # the launch comes after the uploads on the copy stream
        buf.prepare_for(ctx.stream)
    errors = []

    def work():  # this thread has never made the context current
        try:
            axpy.launch(3, 128, (x, y, out, 2.0, n), ctx.stream)
        except Exception as exc:  # re-raised in the main thread below
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors
    out.mark_written()
    assert np.array_equal(out.to_host(), 2 * np.arange(n, dtype=np.float32))


@pytest.mark.cuda
def test_launch_errors_name_the_kernel(ctx, axpy):
    x = DeviceBuffer((4,), np.float32)
    with pytest.raises(drv.CudaUsageError, match=r"'axpy' takes 5 arguments \(ptr, ptr, ptr, f32, u32\), got 3"):
        axpy.launch(1, 32, (x, x, x))
    with pytest.raises(drv.CudaUsageError, match="'axpy'.*do not fit"):
        axpy.launch(1, 32, (x, x, 1.5, 2.0, 4))
    with pytest.raises(drv.CudaUsageError, match="'axpy'.*do not fit"):
        axpy.launch(1, 32, (x, x, x, 2.0, -4))
    with pytest.raises(drv.CudaError, match=r"cuLaunchKernel failed \(kernel 'axpy'\): CUDA_ERROR_INVALID_VALUE"):
        axpy.launch(1, 2048, (x, x, x, 2.0, 4))
    with pytest.raises(BackendError, match="'ghost'.*null function"):
        Kernel(axpy.module, "ghost", 0, ())
    with pytest.raises(BackendError, match="no kernel 'missing'.*axpy"):
        axpy.module.get_function("missing")
    launch_axpy(axpy, x, x, x, 1.0, 4)  # the context is still usable
    x.block_until_ready()


@pytest.mark.cuda
def test_caching_allocator_reuses_blocks_per_stream(ctx):
    alloc, s = CachingAllocator(ctx), ctx.stream
    a = alloc.allocate(1000, s)
    assert (a.size, alloc.stats().misses, alloc.stats().bytes_in_use) == (1024, 1, 1024)
    alloc.free(a)
    stats = alloc.stats()
    assert (stats.bytes_in_use, stats.bytes_cached, stats.cached_blocks) == (0, 1024, 1)
    b = alloc.allocate(900, s)  # same size class
    stats = alloc.stats()
    assert b.ptr == a.ptr and (stats.hits, stats.misses, stats.driver_allocs) == (1, 1, 1)
    assert stats.bytes_requested == 900 and stats.peak_bytes_in_use == 1024
    c = alloc.allocate(5000, s)
    assert c.ptr != b.ptr and alloc.stats().misses == 2
    alloc.free(b)
    other = Stream(ctx)  # nothing cached for it: it takes the block and waits for stream s
    d = alloc.allocate(1000, other)
    assert d.ptr == a.ptr and d.stream is other and alloc.stats().hits == 2
    alloc.record_use(d, s)  # used on s too: pending until s has finished that work
    alloc.free(d)
    assert alloc.stats().cached_blocks == 1
    ctx.synchronize()
    assert alloc.allocate(1000, other).ptr == a.ptr
    assert "live buffers" in str(alloc.describe()) and "bytes_in_use=" in str(alloc.stats())


@pytest.mark.cuda
def test_device_buffers_go_back_to_the_cache(ctx):
    DeviceBuffer((1000,), np.float32)  # freed at once
    before = ctx.allocator.stats()
    buf = DeviceBuffer((999,), np.float32)
    after = ctx.allocator.stats()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    assert buf.stream is ctx.stream and buf.is_ready()


@pytest.mark.cuda
def test_out_of_memory_empties_the_cache_retries_and_reports_what_is_held(ctx):
    alloc, s = CachingAllocator(ctx), ctx.stream
    keep = alloc.allocate(3 << 20, s)
    alloc.free(alloc.allocate(1 << 20, s))
    with pytest.raises(drv.CudaOutOfMemoryError) as info:
        alloc.allocate(1 << 40, s)
    message = str(info.value)
    assert isinstance(info.value, GlueError)
    assert "1024.0 GiB" in message and "glue holds 1 live buffers using 3 MiB" in message
    stats = alloc.stats()
    assert (stats.oom_retries, stats.driver_frees, stats.bytes_cached) == (1, 1, 0)
    alloc.free(alloc.allocate(4096, s))  # still works
    alloc.free(keep)


@pytest.mark.cuda
@pytest.mark.parametrize("ptxas", [False, True], ids=["driver jit", "ptxas"])
def test_module_cache_compiles_and_links_a_ptx_once(ctx, monkeypatch, tmp_path, ptxas):
    ptx = ptx_for_module(axpy_ir(), detected_arch())
    driver = drv.load()
    calls = []
    real = driver.cuModuleLoadData
    monkeypatch.setattr(driver, "cuModuleLoadData", lambda image: calls.append(image) or real(image))
    with config.override(cuda_ptxas=ptxas, cache_dir=str(tmp_path)):
        cache = ModuleCache(ctx)
        module = cache.load(ptx)
        assert cache.load(ptx) is module and len(calls) == 1 and calls[0].startswith(b"\x7fELF")
    assert cache.counts == {"memory_hits": 1, "loads": 1}
    x = DeviceBuffer.from_numpy(np.ones(64, np.float32))
    launch_axpy(module.get_function("axpy"), x, x, x, 2.0, 64)
    assert x.to_host().tolist() == [3.0] * 64


@pytest.mark.cuda
@pytest.mark.parametrize("ptxas", [False, True], ids=["driver jit", "ptxas"])
def test_the_flash_dkv_kernel_keeps_its_registers_once_loaded(ctx, tmp_path, ptxas):
    """As relocatable code ptxas spilled 348 bytes of this kernel's registers (and so slowed it
    by a fifth); it is a warpgroup kernel, compiled as a whole program, where it spills none."""
    if detected_arch() != "sm_90a":
        pytest.skip("the warpgroup flash kernels need sm_90a")
    q = np.zeros((1, 256, 2, 128), ml_dtypes.bfloat16)
    grad = glue.grad(lambda q, k, v: nn.dot_product_attention(q, k, v).astype(gnp.float32).sum(), argnums=(0, 1, 2))
    ptx = glue.jit(grad, backend="cuda").lower(q, q, q).as_text("ptx")
    (dkv,) = [m for m in re.split(r"(?=//\n// Generated by LLVM)", ptx) if re.search(r"\.entry\s+\w*bwd_dkv", m)]
    assert whole_program(dkv)
    name = re.search(r"\.entry\s+(\w+)", dkv).group(1)
    with config.override(cuda_ptxas=ptxas, cache_dir=str(tmp_path)):
        function = ModuleCache(ctx).load(dkv).get_function(name)
    local = drv.call(drv.load().cuFuncGetAttribute, drv.load().CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                     function.handle)
    assert local == 0


@pytest.mark.cuda
def test_bad_ptx_reports_the_jit_log(ctx):
    bad = ptx_for_module(axpy_ir(), ctx.device.arch).replace("add.rn.f32", "add.bogus.f32")
    with pytest.raises(drv.CudaCompileError, match=r"(?s)'broken'.*JIT log:.*bogus"):
        with config.override(cache_dir=""):
            ModuleCache(ctx).load(bad, name="broken")


@pytest.mark.cuda
def test_cross_stream_dependency_through_an_event(ctx, axpy):
    a, b = Stream(ctx), Stream(ctx)
    n, rounds = 1 << 22, 40
    xh = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    x = DeviceBuffer.from_numpy(xh, stream=a)
    y = DeviceBuffer((n,), np.float32, stream=a).fill_bytes(0)
    zero = DeviceBuffer.from_numpy(np.zeros(n, np.float32), stream=b)
    z = DeviceBuffer((n,), np.float32, stream=b).fill_bytes(0xFF)
    b.synchronize()
    start, stop = Event(ctx, timing=True).record(a), Event(ctx, timing=True)
    for _ in range(rounds):  # about 0.5 ms of work on a: b would overtake it without the wait
        launch_axpy(axpy, x, y, y, 1.0, n, a)
    stop.record(a)
    launch_axpy(axpy, y, zero, z, 2.0, n, b)  # waits for a's writes of y (`prepare_for`)
    expected = np.zeros(n, np.float32)
    for _ in range(rounds):
        expected = xh + expected
    assert np.array_equal(z.to_host(), 2 * expected)
    stop.synchronize()
    assert stop.query() and start.elapsed_ms(stop) > 0
    assert a.query() and y.is_ready()
