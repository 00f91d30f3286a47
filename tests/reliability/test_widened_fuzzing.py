"""Fuzzing past the strategies' usual caps: programs of up to 2,000 equations, arrays of up to
2**26 elements, every dtype glue has, adversarial values (huge, tiny, subnormal, NaN, inf,
-0.0, integer extremes), and donated arguments, each against the reference interpreter.

CI runs a few examples of each at moderate sizes; the `thorough` profile reaches the full
sizes (2,000 equations on the cpu backend, 2**26-element arrays).
"""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import glue
import glue.backend
from glue.frontend.tracing import eval_graph
from glue.ir import ClosedGraph, parse, verify
from glue.ir import dtypes as dt
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.testing import check_graph, graph_inputs, programs, tolerance_dtypes
from glue.testing.strategies import arrays, large_programs, seeded_inputs, special_elements

THOROUGH = settings.get_current_profile_name() == "thorough"
EVERY_DTYPE = dt.ALL_DTYPES


@st.composite
def _large_programs_with_inputs(draw, **kwargs):
    graph = draw(large_programs(dtypes=EVERY_DTYPE, **kwargs))
    return graph, seeded_inputs(graph, draw(st.integers(0, 2 ** 32 - 1)))


@settings(max_examples=20 if THOROUGH else 2)
@given(_large_programs_with_inputs(min_eqns=2000, max_eqns=2000))
def test_programs_of_2000_equations_print_parse_verify_and_run(case):
    """The IR layer and the reference take programs of 2,000 equations (no recursion on length)."""
    graph, inputs = case
    assert len(graph.eqns) >= 1900, len(graph.eqns)
    verify(graph)
    assert parse(str(graph)) == graph
    for got, want, dtype in zip(run_graph(graph, inputs), run_graph(graph, inputs, float64=True),
                                tolerance_dtypes(graph)):
        assert mismatch(got, want, dtype) is None


@settings(max_examples=10 if THOROUGH else 1)
@given(_large_programs_with_inputs(min_eqns=1000 if THOROUGH else 250, max_eqns=2000 if THOROUGH else 300))
def test_large_programs_match_the_reference_on_cpu(case):
    check_graph(*case, backends=["cpu"])


_SIDE, _SIZE = (2 ** 13, 2 ** 26) if THOROUGH else (2 ** 9, 2 ** 17)


@settings(max_examples=20 if THOROUGH else 3)
@given(st.data())
def test_programs_on_large_arrays_match_the_reference_on_cpu(data):
    """Up to 2**26 elements (CI: 2**17): long rows, long reductions, big copies."""
    graph = data.draw(programs(dtypes=EVERY_DTYPE, max_eqns=4, max_inputs=2, max_rank=2, max_side=_SIDE,
                               max_size=_SIZE))
    check_graph(graph, data.draw(graph_inputs(graph)), backends=["cpu"])


# Adversarial values make results depend on the order of additions (an overflow in one order
# is finite in another), so these programs avoid sums and contractions; sin and cos are exact
# only for |x| <= 1e5 (float32), as glue.codegen.mathlib documents, not near 3e38. Every other
# primitive must treat NaN, infinities, signed zeros, subnormals and integer extremes as the
# reference does.
_ORDER_FREE = sorted({n for n, p in glue.ir.PRIMITIVES.items() if not p.opaque} - {"reduce_sum", "reduce_prod", "dot_general", "sin", "cos"})
# 16-bit floats compute in float32 between stores, which moves where they overflow.
_EXACT_DTYPES = (dt.float32, dt.float64, dt.int32, dt.int64, dt.bool_)
_MATH_ULPS = 4  # glue's math library against NumPy's, on top of one rounding


def _agree(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where two results of one dtype agree: equal (NaN with NaN), within a few ulps, below
    the smallest normal number apart, or one overflowed where the other is within 2x of it."""
    if not np.issubdtype(want.dtype, np.floating):
        return got == want
    info = np.finfo(want.dtype)
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        close = np.abs(g - w) <= _MATH_ULPS * float(info.eps) * np.maximum(np.abs(g), np.abs(w)) + float(info.tiny)
        edge = (np.isinf(g) & (np.abs(w) >= float(info.max) / 2) & (np.sign(g) == np.sign(w))) | \
            (np.isinf(w) & (np.abs(g) >= float(info.max) / 2) & (np.sign(g) == np.sign(w)))
    return same | close | edge


@st.composite
def _adversarial_cases(draw):
    graph = draw(programs(dtypes=_EXACT_DTYPES, primitives=_ORDER_FREE, max_eqns=6, max_side=5))
    inputs = [draw(arrays(v.type.dtype, v.type.shape, elements=special_elements(v.type.dtype)))
              for v in graph.invars]
    return graph, inputs


@settings(max_examples=1000 if THOROUGH else 30)
@given(_adversarial_cases())
def test_adversarial_values_match_the_reference_on_cpu(case):
    graph, inputs = case
    with np.errstate(all="ignore"):
        expected = run_graph(graph, inputs)
    outs = glue.backend.get_backend("cpu").lower(graph).compile()(*inputs)
    for i, (got, want) in enumerate(zip(outs, expected)):
        got = np.asarray(got)
        bad = ~_agree(got, want)
        if bad.any():
            where = tuple(np.argwhere(bad)[0])
            pytest.fail(f"output {i}: {int(bad.sum())} elements differ, first at {where}: got {got[where]!r}, "
                        f"the reference {want[where]!r}\ninputs {inputs}\n{graph}")


_ADD_ONE = parse("{ lambda ; a:f32[4] . let\n    b:f32[4] = add a 1.0:f32\n  in (b) }")


@settings(max_examples=20 if THOROUGH else 5)
@given(st.data())
@example(data=None)
def test_donated_arguments_leave_numpy_inputs_alone_and_match_the_reference(data):
    graph = _ADD_ONE if data is None else data.draw(programs(dtypes=EVERY_DTYPE, max_eqns=6))
    inputs = [np.array([1, 2, 3, 4], np.float32)] if data is None else data.draw(graph_inputs(graph))
    kept = [x.copy() for x in inputs]
    closed = ClosedGraph(graph, ())
    f = glue.jit(lambda *xs: eval_graph(closed, xs), backend="cpu", donate_argnums=tuple(range(len(inputs))))
    # the programs' 64-bit types are the graph's own: traced without x64 they would narrow
    with glue.config.override(enable_x64=True):
        for _ in range(2):  # the second call sees what the first left in its (donated) arguments
            outs = f(*inputs)
            outs = outs if isinstance(outs, list) else [outs]
            for got, want, dtype in zip(outs, run_graph(graph, kept, float64=True), tolerance_dtypes(graph)):
                assert mismatch(np.asarray(got), want, dtype) is None
    for x, before in zip(inputs, kept):
        np.testing.assert_array_equal(x, before)
