"""Programs the cuda backend tests run: the model workloads, and a call of every glue.numpy and
glue.nn function, each with its arguments (used on the host through the kernel emulator and on
the GPU)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

import glue
import glue.nn as nn
import glue.numpy as gnp
from glue.backend_cuda import CudaBackend
from glue.frontend.tracing import bind
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.testing.check import tolerance_dtypes

BF16 = np.dtype(ml_dtypes.bfloat16)


def softmax(x):
    e = gnp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def layernorm(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * (1 / gnp.sqrt(v + 1e-5)) * w + b


def rmsnorm(x, w):
    return x * (1 / gnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)) * w


def xent(logits, onehot):
    m = logits.max(-1, keepdims=True)
    lse = gnp.log(gnp.exp(logits - m).sum(-1, keepdims=True)) + m
    return ((lse - logits) * onehot).sum(-1).mean()


def bias_gelu(x, b):
    return nn.gelu(x + b)


def mlp(x, w1, b1, w2):
    return gnp.tanh(x @ w1 + b1) @ w2


def _mlp_loss(w1, w2, x, y):
    return ((gnp.tanh(gnp.tanh(x @ w1) @ w2) - y) ** 2).mean()


def train_step(w1, w2, x, y):
    """A small-batch SGD step: thin matmuls with deep K, the kernels that slice K among warps."""
    loss, (g1, g2) = glue.value_and_grad(_mlp_loss, argnums=(0, 1))(w1, w2, x, y)
    return w1 - 0.1 * g1, w2 - 0.1 * g2, loss


def scatter(table, ids, grads):
    return bind("scatter_add", table, ids, grads * 2, axis=0, batch_dims=0)


def embed_bag(table, ids):
    return gnp.take(table, ids, axis=0).sum(1)


def concat_pad(x, y):
    return gnp.concatenate([x, y], axis=1), gnp.pad(x, ((1, 0), (0, 2)))


def column_stats(x):
    return x.sum(0), x.max(0), gnp.argmax(x, axis=1), x.mean()


def row_stats(x):
    return gnp.argmax(x, axis=-1), gnp.argmin(x, axis=-1), x.max(-1), softmax(x)


def transposed(x, y):
    return x.T * 2 + y, (x.T @ y.T).sum()


def rng_arrays(seed: int, *specs):
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in specs:
        if np.dtype(dtype).kind in "iu":
            out.append(rng.integers(0, 5, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


WORKLOADS = {
    "softmax": (softmax, [((6, 40), np.float32)]),
    "softmax_bf16": (softmax, [((5, 72), BF16)]),
    "softmax_long": (softmax, [((2, 40000), np.float32)]),
    "softmax_long_bf16": (softmax, [((2, 40000), BF16)]),
    "xent_long": (xent, [((2, 40000), np.float32), ((2, 40000), np.float32)]),
    "layernorm": (layernorm, [((7, 64), np.float32), ((64,), np.float32), ((64,), np.float32)]),
    "layernorm_bf16": (layernorm, [((3, 96), BF16), ((96,), BF16), ((96,), BF16)]),
    "rmsnorm": (rmsnorm, [((9, 33), np.float32), ((33,), np.float32)]),
    "xent": (xent, [((4, 300), np.float32), ((4, 300), np.float32)]),
    "bias_gelu": (bias_gelu, [((5, 24), np.float32), ((24,), np.float32)]),
    "bias_gelu_f16": (bias_gelu, [((3, 40), np.float16), ((40,), np.float16)]),
    "mlp": (mlp, [((9, 20), np.float32), ((20, 70), np.float32), ((70,), np.float32), ((70, 3), np.float32)]),
    "scatter": (scatter, [((10, 8), np.float32), ((4, 3), np.int32), ((4, 3, 8), np.float32)]),
    "scatter_bf16": (scatter, [((6, 16), BF16), ((9,), np.int32), ((9, 16), BF16)]),
    "embed_bag": (embed_bag, [((10, 8), np.float32), ((4, 3), np.int32)]),
    "concat_pad": (concat_pad, [((3, 4), np.float32), ((3, 5), np.float32)]),
    "column_stats": (column_stats, [((37, 12), np.float32)]),
    "row_stats": (row_stats, [((5, 2000), np.float32)]),
    "row_stats_f64": (row_stats, [((3, 1500), np.float64)]),
    "row_stats_i32": (lambda x: (gnp.argmax(x, axis=-1), x.sum(-1), x.min(-1)), [((3, 999), np.int32)]),
    "row_stats_long_i32": (lambda x: (x.max(-1), gnp.argmax(x, axis=-1), (x - x.min(-1, keepdims=True)).sum(-1),
                                      gnp.argmin(x, axis=-1)), [((2, 40000), np.int32)]),
    "transposed": (transposed, [((6, 5), np.float32), ((5, 6), np.float32)]),
    "train_step": (train_step, [((100, 72), np.float32), ((72, 96), np.float32), ((5, 100), np.float32),
                                ((5, 96), np.float32)]),
    "thin_matmul": (lambda a, b: gnp.tanh(a @ b), [((3, 260), np.float32), ((260, 7), np.float32)]),
}



# --- every glue.numpy and glue.nn function ----------------------------------------------------

def f32(*shape, dtype=np.float32, lo=-3.0, hi=3.0, seed=0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def i32(*shape, lo=-5, hi=6, seed=0):
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(np.int32)


X, Y, P = f32(3, 8), f32(3, 8, seed=1), f32(3, 8, lo=0.5, hi=4.0, seed=2)
I, J = i32(3, 8), i32(3, 8, lo=1, seed=3)
B = X > 0
UNARY = ["abs", "absolute", "negative", "sign", "square", "exp", "exp2", "expm1", "tanh", "sin", "cos",
         "floor", "ceil", "round", "isnan", "isinf", "isfinite"]
POSITIVE = ["log", "log1p", "log2", "sqrt", "reciprocal"]
BINARY = ["add", "subtract", "multiply", "divide", "true_divide", "maximum", "minimum", "power", "logaddexp",
          "equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]
INTEGER = ["floor_divide", "remainder", "mod", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor"]
LOGICAL = ["logical_and", "logical_or", "logical_xor"]
REDUCTIONS = ["sum", "prod", "max", "min", "amax", "amin", "mean", "var", "std", "argmax", "argmin", "any", "all"]

NUMPY_CASES = (
    [(n, lambda x, n=n: getattr(gnp, n)(x), (X,)) for n in UNARY]
    + [(n, lambda x, n=n: getattr(gnp, n)(x), (P,)) for n in POSITIVE]
    + [(n, lambda x, y, n=n: getattr(gnp, n)(x, y), (P if n == "power" else X, Y)) for n in BINARY]
    + [(n, lambda x, y, n=n: getattr(gnp, n)(x, y), (I, J)) for n in INTEGER]
    + [(n, lambda x, y, n=n: getattr(gnp, n)(x, y), (B, Y > 0)) for n in LOGICAL]
    + [(f"{n}_axis{a}", lambda x, n=n, a=a: getattr(gnp, n)(x > 0 if n in ("any", "all") else x, axis=a), (X,))
       for n in REDUCTIONS for a in (0, 1)]
    + [(f"{n}_all", lambda x, n=n: getattr(gnp, n)(x > 0 if n in ("any", "all") else x), (X,))
       for n in REDUCTIONS if not n.startswith("arg")]
    + [
        ("bitwise_not", gnp.bitwise_not, (I,)), ("invert", gnp.invert, (B,)),
        ("logical_not", gnp.logical_not, (B,)),
        ("clip", lambda x: gnp.clip(x, -1.0, 2.0), (X,)),
        ("where", lambda b, x, y: gnp.where(b, x, y), (B, X, Y)),
        ("astype", lambda x: gnp.astype(x, BF16), (X,)), ("asarray", lambda x: gnp.asarray(x) + 1, (X,)),
        ("array", lambda x: gnp.array(x) * 2, (X,)),
        ("matmul", gnp.matmul, (X, f32(8, 5))), ("dot", gnp.dot, (X, f32(8, 5))),
        ("matmul_batched", gnp.matmul, (f32(2, 3, 8), f32(2, 8, 4))),
        ("einsum", lambda x, y: gnp.einsum("ij,kj->ik", x, y), (X, Y)),
        ("reshape", lambda x: gnp.reshape(x, (4, 6)) * 2, (X,)), ("ravel", lambda x: gnp.ravel(x) + 1, (X,)),
        ("transpose", lambda x: gnp.transpose(x) + 1, (X,)),
        ("swapaxes", lambda x: gnp.swapaxes(x, 0, 1) * 3, (X,)),
        ("moveaxis", lambda x: gnp.moveaxis(_3d(x), 0, 2) - 1, (X,)),
        ("expand_dims", lambda x: gnp.expand_dims(x, 1) * 2, (X,)),
        ("squeeze", lambda x: gnp.squeeze(gnp.expand_dims(x, 0)) + 1, (X,)),
        ("broadcast_to", lambda x: gnp.broadcast_to(x[0], (5, 8)) + 0, (X,)),
        ("concatenate", lambda x, y: gnp.concatenate([x, y], axis=1), (X, Y)),
        ("stack", lambda x, y: gnp.stack([x, y], axis=1), (X, Y)),
        ("split", lambda x: gnp.split(x, 2, axis=1)[1] * 2, (X,)),
        ("flip", lambda x: gnp.flip(x, 1) + 0, (X,)),
        ("pad", lambda x: gnp.pad(x, ((1, 2), (0, 3))), (X,)),
        ("tril", lambda x: gnp.tril(x), (X,)), ("triu", lambda x: gnp.triu(x, 1), (X,)),
        ("take", lambda x, i: gnp.take(x, i, axis=1), (X, i32(5, lo=0, hi=8))),
        ("take_along_axis", lambda x, i: gnp.take_along_axis(x, i, axis=1), (X, i32(3, 4, lo=0, hi=8))),
        ("getitem", lambda x: x[1:, ::2] * 2, (X,)),
        ("full", lambda x: x + gnp.full((3, 8), 2.5), (X,)), ("full_like", lambda x: gnp.full_like(x, 7.0), (X,)),
        ("zeros", lambda x: x + gnp.zeros((3, 8)), (X,)), ("ones", lambda x: x + gnp.ones((3, 8)), (X,)),
        ("zeros_like", lambda x: gnp.zeros_like(x) - x, (X,)), ("ones_like", lambda x: gnp.ones_like(x) + x, (X,)),
        ("arange", lambda x: x + gnp.arange(8), (X,)), ("eye", lambda x: gnp.eye(8) @ x.T, (X,)),
    ]
)


def _3d(x):
    return gnp.reshape(x, (3, 2, 4))


NN_CASES = [
    (n, getattr(nn, n), (X,)) for n in ("relu", "sigmoid", "silu", "gelu", "softplus", "log_sigmoid",
                                         "softmax", "log_softmax", "logsumexp")
] + [
    ("gelu_erf", lambda x: nn.gelu(x, approximate=False), (X,)),
    ("one_hot", lambda i: nn.one_hot(i, 8), (i32(6, lo=0, hi=8),)),
    ("layer_norm", lambda x, w, b: nn.layer_norm(x, w, b), (X, f32(8, seed=5), f32(8, seed=6))),
    ("rms_norm", lambda x, w: nn.rms_norm(x, w), (X, f32(8, seed=5))),
    ("cross_entropy", lambda x, i: nn.cross_entropy(x, i), (X, i32(3, lo=0, hi=8))),
]

ALL_CASES = NUMPY_CASES + NN_CASES


def assert_matches_reference(graph, inputs, outs, label):
    """Each output within the reference's tolerance of the float64 reference result."""
    want = run_graph(graph, [np.asarray(a) for a in inputs], float64=True)
    assert len(outs) == len(want)
    for i, (got, w, d) in enumerate(zip(outs, want, tolerance_dtypes(graph, tf32=CudaBackend.rounds_to_tf32))):
        problem = mismatch(np.asarray(got), w, d)
        assert problem is None, f"{label}: output {i}: {problem}\n{graph}"


def contraction_outputs_on_gpu(closed, args, strategy: str, **options) -> tuple[list, list]:
    """Run a traced program on the GPU with poisoned outputs, after checking that one of its
    contractions took a kernel whose strategy starts with `strategy`, twice (the second call a
    graph replay, which must give the same bits). Returns (outputs, every argument)."""
    with glue.config.override(cuda_poison=0xFF):
        low = CudaBackend().lower(closed.graph, **options)
        assert any(launch.strategy.startswith(strategy) for launch in low["llvm"].launches
                   if launch.kind == "contraction")
        exe = low.compile()
        all_args = list(closed.consts) + list(args)
        outs = [np.asarray(o) for o in exe(*all_args)]
        again = [np.asarray(o) for o in exe(*all_args)]
    for a, b in zip(outs, again):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    return outs, all_args


def check_outputs(closed, all_args, outs, label: str, tf32: bool = False) -> None:
    """Each output against the float64 reference, at its dtype's tolerance (TF32's where the
    program's products may round to it)."""
    want = run_graph(closed.graph, all_args, float64=True)
    for i, (got, w, d) in enumerate(zip(outs, want, tolerance_dtypes(closed.graph, tf32=tf32))):
        problem = mismatch(got, w, d if d is not None else closed.graph.out_types[i].dtype, scale=4.0)
        assert problem is None, f"{label}, output {i}: {problem}"
