"""glue.random across backends and transforms: the same key gives the same bits on the
reference, the cpu backend and the cuda kernels (run by the emulator; their PTX assembles), the
same numbers eagerly and under jit, vmap over keys is a loop over them, and grad goes through
a sampler to its float parameters."""
from __future__ import annotations

import numpy as np
import pytest

import glue
from glue import nn, random
from glue.backend_cpu import CpuBackend
from glue.backend_cuda.codegen import build_program
from glue.backend_cuda.ptx import assemble, ptx_for_module, ptxas_available
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.scheduler.plan import schedule
from glue.settings import config
from tests.backend_cuda import emulator

KEY = random.PRNGKey(2024)

# name: (function of a raw key, whether its outputs are exact: bits, ints, bools, uniform floats)
PROGRAMS = {
    "bits": (lambda k: (random.bits(k, (5, 7)), random.bits(k, (9,), np.uint8)), True),
    "split and fold_in": (lambda k: (random.split(k, 3), random.fold_in(k, 9)), True),
    "uniform": (lambda k: (random.uniform(k, (33,), minval=-1.0, maxval=2.0),
                           random.uniform(k, (6,), "bfloat16")), True),
    "randint and bernoulli": (lambda k: (random.randint(k, (40,), 0, 256, np.uint8),
                                         random.bernoulli(k, 0.4, (3, 5))), True),
    "permutation": (lambda k: random.permutation(k, 12), True),
    "normal": (lambda k: (random.normal(k, (8, 9)), random.normal(k, (4,), np.float16)), False),
    "tails": (lambda k: (random.truncated_normal(k, -0.5, 1.5, (20,)), random.gumbel(k, (10,)),
                         random.exponential(k, (10,))), False),
}


def _flat(outs):
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]


def _same(got, want, exact: bool, dtype, label: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, label
    if exact:
        assert np.atleast_1d(got).view(np.uint8).tolist() == np.atleast_1d(want).view(np.uint8).tolist(), label
    else:
        problem = mismatch(got, want, dtype)
        assert problem is None, f"{label}: {problem}"


# The counter scheme changes only where bits come from, so the earlier one is run on the
# programs that draw bits in different ways (it schedules more slowly).
CASES = [(name, True) for name in sorted(PROGRAMS)] + [(name, False) for name in ("bits", "split and fold_in", "uniform")]


@pytest.mark.parametrize("name, partitionable", CASES, ids=[f"{n}-{'partitionable' if p else 'original'}" for n, p in CASES])
def test_every_backend_gives_the_same_numbers(name, partitionable):
    fn, exact = PROGRAMS[name]
    with config.override(threefry_partitionable=partitionable):
        closed = glue.make_ir(fn)(KEY)
    graph, args = closed.graph, list(closed.consts) + [np.asarray(KEY)]
    want = run_graph(graph, args)
    dtypes = [t.dtype for t in graph.out_types]
    cpu = CpuBackend().lower(graph).compile()(*args)
    for i, (got, w, d) in enumerate(zip(cpu, want, dtypes)):
        _same(got, w, exact, d, f"{name}: cpu output {i}")
    if emulator.available():
        program = build_program(schedule(graph), name.replace(" ", "_"))
        for i, (got, w, d) in enumerate(zip(emulator.run_program(program, args), want, dtypes)):
            _same(got, w, exact, d, f"{name}: cuda output {i}")
        if ptxas_available():
            for module in program.llvm_modules().values():
                assemble(ptx_for_module(module, "sm_90"), "sm_90")


def test_eager_calls_and_jit_agree():
    eager = np.asarray(random.normal(KEY, (3, 4)))
    jitted = np.asarray(glue.jit(lambda k: random.normal(k, (3, 4)))(KEY))
    reference = np.asarray(glue.jit(lambda k: random.normal(k, (3, 4)), backend="reference")(KEY))
    assert eager.tolist() == jitted.tolist()
    assert mismatch(eager, reference, glue.ir.dtypes.float32) is None


def test_a_traced_key_gives_the_numbers_of_the_concrete_one():
    keys = random.split(KEY, 3)
    jitted = glue.jit(lambda ks: [random.uniform(ks[i], (4,)) for i in range(3)], backend="reference")(keys)
    for i, got in enumerate(jitted):
        assert np.asarray(got).tolist() == np.asarray(random.uniform(keys[i], (4,))).tolist()


def test_vmap_over_keys_and_over_fold_in_data_is_a_loop():
    keys = random.split(KEY, 5)
    got = glue.vmap(lambda k: random.normal(k, (3,)))(keys)
    assert np.asarray(got).tolist() == [np.asarray(random.normal(k, (3,))).tolist() for k in keys]
    steps = np.arange(4, dtype=np.uint32)
    folded = glue.vmap(lambda s: random.fold_in(KEY, s))(steps)
    assert np.asarray(folded).tolist() == [np.asarray(random.fold_in(KEY, int(s))).tolist() for s in steps]
    nested = glue.vmap(glue.vmap(lambda k: random.bits(k, (2,))))(np.asarray(random.split(KEY, (2, 3))))
    assert np.asarray(nested).shape == (2, 3, 2)


def test_grad_goes_through_a_sampler_to_its_parameters():
    noise = np.asarray(random.normal(KEY, (6,))).astype(np.float64)

    def loss(mu, sigma):
        return (random.normal(KEY, (6,)) * sigma + mu).sum()

    d_mu, d_sigma = glue.grad(loss, argnums=(0, 1))(np.float32(0.5), np.float32(2.0))
    assert float(d_mu) == pytest.approx(6.0) and float(d_sigma) == pytest.approx(noise.sum(), rel=1e-5)
    jitted = glue.jit(glue.grad(loss, argnums=1))(np.float32(0.5), np.float32(2.0))
    assert float(jitted) == pytest.approx(noise.sum(), rel=1e-5)
    per_key = glue.vmap(glue.grad(lambda s, k: (random.normal(k, (2,)) * s).sum()), in_axes=(None, 0))(
        np.float32(1.0), random.split(KEY, 3))
    assert np.asarray(per_key).shape == (3,)


def test_grad_through_dropout_is_the_mask_scaled():
    x = np.ones((4, 8), np.float32)
    g = glue.grad(lambda x: nn.dropout(KEY, 0.5, x).sum())(x)
    mask = np.asarray(random.bernoulli(KEY, 0.5, x.shape))
    assert np.asarray(g).tolist() == np.where(mask, 2.0, 0.0).tolist()


def test_grad_of_truncated_normal_bounds_is_finite():
    g = glue.grad(lambda lo: random.truncated_normal(KEY, lo, 2.0, (50,)).sum())(np.float32(-1.0))
    assert np.isfinite(float(g))
