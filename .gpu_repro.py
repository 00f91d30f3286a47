"""Repro of cuBLASLt's INVALID_VALUE on eye(8) @ x.T (x 3x8), with its log."""
import os
os.environ["CUBLASLT_LOG_LEVEL"] = "5"
import numpy as np, glue, glue.numpy as gnp
from glue.backend_cuda import CudaBackend, cublaslt
for shape in [(3, 8), (64, 8), (4, 8)]:
    X = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    closed = glue.make_ir(lambda x: gnp.eye(8) @ x.T)(X)
    low = CudaBackend().lower(closed.graph, gemm="library")
    for l in low["llvm"].launches:
        if l.library:
            g = l.library
            print(shape, cublaslt.problem(g.spec, g.a, g.b, g.d, g.precision), flush=True)
    try:
        out = low.compile()(X)
        print(shape, "ok", np.abs(np.asarray(out[0]) - np.eye(8) @ X.T).max(), flush=True)
    except Exception as exc:
        print(shape, "failed", exc, flush=True)
