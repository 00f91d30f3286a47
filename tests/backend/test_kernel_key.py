"""Structural kernel keys: equal for the same code whatever the names, different wherever the
code would differ; and the cpu backend compiling each distinct kernel once."""
import copy
import gc
import pickle
from dataclasses import replace

import numpy as np
from hypothesis import given, settings

import glue
import glue.numpy as gnp
from glue.backend import kernel_key as kernel_key_module
from glue.backend.kernel_key import KernelKeys, aliases, kernel_key, structure_text
from glue.backend_cpu import CpuBackend, code
from glue.ir import dtypes as dt
from glue.scheduler.kernel_ir import Const, Index, Load, Op, Store
from glue.scheduler.plan import schedule
from glue.testing import programs


def _renamed(kernel):
    """The same kernel over other Graph values, with other names."""
    return replace(kernel, name="renamed", source=("elsewhere.py:1",), ops=("other",),
                   inputs=tuple(replace(b, value_id=b.value_id + 1000) for b in kernel.inputs),
                   outputs=tuple(replace(b, value_id=b.value_id + 2000) for b in kernel.outputs))


def _own_aliases(kernel):
    return aliases([b.value_id for b in kernel.inputs + kernel.outputs])


@settings(max_examples=60)
@given(programs(max_eqns=8))
def test_keys_ignore_names_and_graph_values(graph):
    for kernel in schedule(graph).kernels:
        shared = _own_aliases(kernel)
        assert kernel_key(kernel, shared, "ctx") == kernel_key(_renamed(kernel), shared, "ctx")
        assert kernel_key(kernel, shared, "ctx") != kernel_key(kernel, shared, "other ctx")


@settings(max_examples=60)
@given(programs(max_eqns=8))
def test_keys_depend_on_values_not_on_which_nodes_are_shared(graph):
    # a Plan read back from the disk cache shares fewer nodes with glue's interned ones (Index.dim)
    for kernel in schedule(graph).kernels:
        shared = _own_aliases(kernel)
        unshared = replace(kernel, stores=tuple(copy.deepcopy(s) for s in kernel.stores))
        key = kernel_key(kernel, shared)
        assert kernel_key(pickle.loads(pickle.dumps(kernel)), shared) == key
        assert kernel_key(unshared, shared) == key


def test_equal_nodes_are_one_line_of_the_structure():
    one = Load(0, (Index.dim(0),), dt.float32)
    other = Load(0, (copy.deepcopy(Index.dim(0)),), dt.float32)
    assert one is not other
    assert structure_text([(one, one)]) == structure_text([(one, other)])


def _pointwise():
    x = np.ones((4, 8), np.float32)
    (kernel,) = schedule(glue.make_ir(lambda x: gnp.tanh(x * 3.0) + x)(x).graph).kernels
    return kernel


def test_keys_differ_where_the_code_would():
    kernel = _pointwise()
    shared = _own_aliases(kernel)
    base = kernel_key(kernel, shared)
    store = kernel.stores[0]
    const_changed = replace(kernel, stores=(replace(store, value=Op("add", (store.value, Const(1.0, dt.float32)),
                                                                        dt.float32)),))
    wider = replace(kernel, inputs=tuple(replace(b, type=glue.ir.TensorType((4, 9), b.type.dtype))
                                         for b in kernel.inputs))
    in_place = (0,) * len(shared)
    variants = [kernel_key(const_changed, shared), kernel_key(wider, shared), kernel_key(kernel, in_place),
                kernel_key(replace(kernel, parallel=(8, 4)), shared)]
    assert len({base, *variants}) == 1 + len(variants)


def test_aliases_number_each_place_by_its_first_operand():
    assert aliases(["a", "b", "a", "c", "b"]) == (0, 1, 0, 3, 1)


def test_a_deep_kernel_is_keyed_without_recursion():
    e = Load(0, (Index.dim(0),), dt.float32)
    for i in range(20_000):
        e = Op("add" if i % 2 else "mul", (e, Const(float(i % 7), dt.float32)), dt.float32)
    store = Store(0, e, "element", (Index.dim(0),))
    lines = structure_text([(store,)])
    assert len(lines) > 20_000 and lines[-1].startswith("tuple(")


def _mlp(x, ws):
    for w in ws:
        x = gnp.tanh(x @ w + 1.0)
    return x


def test_identical_layers_run_one_compiled_kernel():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    ws = [rng.standard_normal((16, 16)).astype(np.float32) * 0.3 for _ in range(4)]
    low = CpuBackend().lower(glue.make_ir(_mlp)(x, ws).graph, name="mlp")
    program = low["program"]
    assert len(program.uses) == 4 and len(program.sources) == 1
    exe = low.compile()
    (stats,) = low.kernel_stats.values()
    assert stats.uses == 4
    want = x.astype(np.float64)
    for w in ws:
        want = np.tanh(want @ w + 1.0)
    np.testing.assert_allclose(np.asarray(exe(x, *ws)[0]), want, rtol=1e-5, atol=1e-5)


def test_a_program_hashes_each_distinct_structure_once(monkeypatch):
    """The layers' copies of one lowered group share its expressions: `KernelKeys` walks them
    once and gives every kernel the key `kernel_key` gives it."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    ws = [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(6)]
    kernels = schedule(glue.make_ir(_mlp)(x, ws).graph).kernels
    walked = []
    monkeypatch.setattr(kernel_key_module, "kernel_key", lambda *a, **kw: walked.append(a) or kernel_key(*a, **kw))
    keys = KernelKeys()
    for kernel in kernels:
        shared = _own_aliases(kernel)
        assert keys(kernel, shared, "ctx") == kernel_key(kernel, shared, "ctx") != keys(kernel, shared, "other")
    assert len(kernels) == 6 and len(walked) == 2  # one walk per context


def test_programs_share_the_code_of_their_identical_kernels_in_memory():
    x = np.ones((8, 16), np.float32)
    ws = [np.full((16, 16), 0.01, np.float32)] * 2
    first = glue.jit(_mlp, backend="cpu").lower(x, ws).compile()
    second = glue.jit(lambda x, ws: _mlp(x, ws[:1]), backend="cpu").lower(x, ws).compile()
    assert second.compile_stats()["cache"]["memory"] == 1
    (key,) = second.executable._code
    assert first.executable._code[key] is second.executable._code[key]
    np.testing.assert_allclose(np.asarray(second(x, ws)), np.tanh(x @ ws[0] + 1.0), rtol=1e-6)
    del first, second
    gc.collect()
    assert key not in code._loaded  # the code goes when no program runs it
