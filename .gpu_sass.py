"""Dump the SASS op mix of glue's tensor-core kernel for a 4096^3 bf16 product (device helper)."""
import collections, os, re, subprocess, sys
import numpy as np, ml_dtypes
import glue
from glue.backend_cuda import CudaBackend
out = os.environ["OUT"]
for lay in ("NN", "NT", "TN"):
    M = K = N = 4096
    x = np.ones((M, K) if lay[0] == "N" else (K, M), ml_dtypes.bfloat16)
    w = np.ones((K, N) if lay[1] == "N" else (N, K), ml_dtypes.bfloat16)
    f = {"NN": lambda a, b: a @ b, "NT": lambda a, b: a @ b.T, "TN": lambda a, b: a.T @ b}[lay]
    low = CudaBackend().lower(glue.make_ir(f)(x, w).graph, arch="sm_90", gemm="codegen")
    (ptx,) = low["ptx"].modules.values()
    open(f"{out}/{lay}.ptx", "w").write(ptx)
    r = subprocess.run(["ptxas", "-arch=sm_90", "-v", f"{out}/{lay}.ptx", "-o", f"/tmp/{lay}.cubin"], capture_output=True, text=True)
    sass = subprocess.run(["cuobjdump", "-sass", f"/tmp/{lay}.cubin"], capture_output=True, text=True).stdout
    open(f"{out}/{lay}.sass", "w").write(sass)
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)", sass))
    print(lay, [l.strategy for l in low["llvm"].launches], r.stderr.strip().splitlines()[-2:], sum(ops.values()), ops.most_common(14))
