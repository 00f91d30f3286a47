"""Host cost of a kernel launch through glue's CUDA runtime, against raw cuda.bindings and ctypes.

    PYTHONPATH=. python3 benchmarks/cuda_launch.py [--json out.json]

Each row is the median over N launches of the host time one call takes to queue (perf_counter_ns
around the call; the device is synchronised every 200 calls, outside the timed calls, so the
launch queue never fills). Needs a GPU.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import numpy as np

from glue.backend_cuda.ptx import ptx_for_module
from glue.backend_cuda.runtime import DeviceBuffer, get_context, transfer
from tests.backend_cuda.kernels import axpy_ir, empty_ir

N = 1000


def per_call_us(fn, sync) -> float:
    for _ in range(50):
        fn()
    sync()
    times = []
    for i in range(N):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
        if i % 200 == 199:
            sync()
    sync()
    return statistics.median(times) / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()

    ctx = get_context()
    default_direct = transfer.DIRECT_MAX
    from cuda.bindings import driver
    stream = ctx.stream
    sync = stream.synchronize
    empty = ctx.modules.load(ptx_for_module(empty_ir(), ctx.device.arch)).get_function("empty")
    axpy = ctx.modules.load(ptx_for_module(axpy_ir(), ctx.device.arch)).get_function("axpy")
    n = 1 << 10
    x = DeviceBuffer.from_numpy(np.ones(n, np.float32))
    y = DeviceBuffer.from_numpy(np.ones(n, np.float32))
    out = DeviceBuffer((n,), np.float32)
    launch = driver.cuLaunchKernel
    f_obj, s_obj = driver.CUfunction(empty.handle), driver.CUstream(stream.handle)
    eh, ah, sh = empty.handle, axpy.handle, stream.handle
    pack, empty_pack = axpy.bind((x, y, out, 2.0, n)), empty.bind(())
    argv_np = np.array([ctypes.c_void_p.from_address(pack.address + 8 * i).value for i in range(5)],
                       dtype=np.uint64)
    types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_uint32)
    c_launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    c_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    c_launch.restype = ctypes.c_int
    small = np.ones(16, np.float32)
    small_buf = DeviceBuffer.from_numpy(small)

    def tiny_axpy(a: DeviceBuffer, b: DeviceBuffer) -> np.ndarray:
        result = DeviceBuffer((16,), np.float32)
        axpy.launch(1, 32, (a, b, result, 2.0, 16), stream)
        result.mark_written()
        return result.to_host()

    rows = {
        "empty: raw bindings, int handles, kernelParams=0":
            lambda: launch(eh, 1, 1, 1, 32, 1, 1, 0, sh, 0, 0),
        "empty: raw bindings, CUfunction/CUstream objects":
            lambda: launch(f_obj, 1, 1, 1, 32, 1, 1, 0, s_obj, 0, 0),
        "empty: ctypes libcuda.cuLaunchKernel":
            lambda: c_launch(eh, 1, 1, 1, 32, 1, 1, 0, sh, None, None),
        "empty: glue Kernel.launch":
            lambda: empty.launch(1, 32, (), stream),
        "empty: glue Kernel.launch_packed":
            lambda: empty.launch_packed(empty_pack, (1, 1, 1), (32, 1, 1), stream),
        "axpy: raw bindings, ((values), (ctypes types)) tuples":
            lambda: launch(ah, 8, 1, 1, 128, 1, 1, 0, sh,
                           ((x.ptr, y.ptr, out.ptr, 2.0, n), types), 0),
        "axpy: raw bindings, pre-packed numpy void* array":
            lambda: launch(ah, 8, 1, 1, 128, 1, 1, 0, sh, argv_np, 0),
        "axpy: raw bindings, pre-packed int address":
            lambda: launch(ah, 8, 1, 1, 128, 1, 1, 0, sh, pack.address, 0),
        "axpy: glue Kernel.launch (packs 5 args each call)":
            lambda: axpy.launch(8, 128, (x, y, out, 2.0, n), stream),
        "axpy: glue Kernel.launch_packed (bound args)":
            lambda: axpy.launch_packed(pack, (8, 1, 1), (128, 1, 1), stream),
        "axpy: glue launch + out.mark_written (event record)":
            lambda: (axpy.launch(8, 128, (x, y, out, 2.0, n), stream), out.mark_written()),
        "Stream.record(event) alone": lambda: stream.record(out.event),
        "Stream.wait(event) alone": lambda: stream.wait(out.event),
        "DeviceBuffer((16,), f32) alloc + free (cache hit)":
            lambda: DeviceBuffer((16,), np.float32),
        "DeviceBuffer.from_numpy(16 x f32) (async upload)":
            lambda: DeviceBuffer.from_numpy(small),
        "DeviceBuffer.to_host() of 16 x f32 (includes the wait)":
            lambda: small_buf.to_host(),
        "16-element axpy end to end: 2 uploads, output alloc, launch, to_host":
            lambda: tiny_axpy(DeviceBuffer.from_numpy(small), DeviceBuffer.from_numpy(small)),
    }
    for size in (64, 64 << 10):
        host = np.ones(size // 4, np.float32)
        dev = DeviceBuffer.from_numpy(host)
        for label, limit in (("glue staging", 0), ("direct pageable", size)):
            rows[f"upload {size} B, {label}"] = (limit, lambda h=host, d=dev: transfer.upload(d.ptr, h, stream))
        rows[f"download {size} B (includes the wait)"] = lambda h=host, d=dev: transfer.download(h, d.ptr, stream)
    results = {}
    for name, fn in rows.items():
        transfer.DIRECT_MAX, fn = fn if isinstance(fn, tuple) else (default_direct, fn)
        results[name] = per_call_us(fn, sync)
    transfer.DIRECT_MAX = default_direct
    np.testing.assert_array_equal(out.to_host(), np.full(n, 3.0, np.float32))
    width = max(map(len, results))
    print(f"{'host us per call (median of %d)' % N:<{width}}  us")
    for name, us in results.items():
        print(f"{name:<{width}}  {us:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(ctx.device), "calls": N, "us_per_call_median": results}, f, indent=1)


if __name__ == "__main__":
    main()
