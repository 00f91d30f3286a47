"""Device helper: glue's tensor-core kernel per tile configuration on a few products (graph replays)."""
import numpy as np, ml_dtypes
import glue, glue.numpy as gnp
from glue.backend_cuda.runtime import get_context
from benchmarks.cuda_matmul import _burst_us
import torch
BF16 = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
shapes = {"4096^3": ("mk,kn->mn", (4096, 4096), (4096, 4096)), "8192^3": ("mk,kn->mn", (8192, 8192), (8192, 8192)),
          "mlp up fwd": ("mk,kn->mn", (4096, 768), (768, 3072)), "qkv dgrad": ("mn,kn->mk", (4096, 2304), (768, 2304)),
          "mlp up wgrad": ("mk,mn->kn", (4096, 768), (4096, 3072)), "head fwd": ("mk,kn->mn", (4096, 768), (768, 8192))}
tiles = [None, "128x128x32/2x2", "128x256x32/2x4", "256x128x32/4x2", "128x128x64/2x2"]
for label, (spec, sa, sb) in shapes.items():
    a, b = rng.standard_normal(sa).astype(BF16), rng.standard_normal(sb).astype(BF16)
    lhs, rhs = spec.split("->")[0].split(",")
    sizes = {c: n for t, s in zip((lhs, rhs), (sa, sb)) for c, n in zip(t, s)}
    flops = 2 * int(np.prod(list(sizes.values())))
    ta, tb = torch.tensor(a.astype(np.float32)).cuda().bfloat16(), torch.tensor(b.astype(np.float32)).cuda().bfloat16()
    torch_us = _burst_us(lambda: torch.einsum(spec, ta, tb))
    row = [f"{label}: torch {flops / torch_us / 1e6:.0f}"]
    ref = torch.einsum(spec, ta.float(), tb.float()).cpu().numpy()
    for tile in tiles:
        with glue.config.override(cuda_mma_tile=tile):
            f = glue.jit(lambda x, y: gnp.einsum(spec, x, y), backend="cuda", backend_options={"gemm": "codegen"})
            args = [glue.device_put(v, "cuda") for v in (a, b)]
            out = np.asarray(f(*args)).astype(np.float32)
            err = float(np.abs(out - ref).max() / np.abs(ref).max())
            for _ in range(3):
                f(*args).block_until_ready()
            exe = next(iter(f._compiled.values())).executable
            graph = exe.last_graph
            us = _burst_us(lambda: graph.launch(get_context().stream))
        row.append(f"{tile or 'auto'} {flops / us / 1e6:.0f} ({100 * torch_us / us:.0f}%, err {err:.0e})")
    print(" | ".join(row), flush=True)
