"""The user-facing strategies: shapes, dtypes, arrays and random programs (their parameters,
their coverage of the IR, and how they shrink)."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import find, given, settings, strategies as st

from glue import GlueError
from glue.ir import PRIMITIVES, Var, verify
from glue.ir import dtypes as dt
from glue.testing import HELPER_PRIMITIVES, arrays, dtypes, graph_inputs, programs, shapes


@given(shapes(min_rank=1, max_rank=3, min_side=2, max_side=5))
def test_shapes_respect_their_bounds(shape):
    assert 1 <= len(shape) <= 3 and all(2 <= n <= 5 for n in shape)


@given(dtypes(kinds=("float",)))
def test_dtypes_of_a_kind(d):
    assert d.is_float


def test_unknown_kind_is_a_glue_error():
    with pytest.raises(GlueError, match="unknown kinds"):
        dtypes(kinds=("complex",))


@given(st.data())
def test_arrays_are_finite_moderate_and_never_all_zero(data):
    d = data.draw(dtypes())
    shape = data.draw(shapes())
    a = data.draw(arrays(d, shape))
    assert a.shape == shape and a.dtype == d.numpy
    assert a.any()
    if d.is_float:
        wide = a.astype(np.float64)
        assert np.isfinite(wide).all() and np.abs(wide).max() <= 4


@given(arrays(dt.bfloat16, st.just((4,)), elements=st.sampled_from([0.0, 0.5])))
def test_arrays_with_given_elements_in_bfloat16(a):
    assert a.dtype == np.dtype(ml_dtypes.bfloat16)
    assert set(a.astype(np.float32).tolist()) <= {0.0, 0.5} and a.any()


@given(programs(min_inputs=2, max_inputs=3, max_eqns=5, max_rank=2, max_side=3))
def test_programs_respect_their_parameters(graph):
    verify(graph)
    assert 2 <= len(graph.invars) <= 3 and 1 <= len(graph.eqns) <= 5
    assert all(v.type.ndim <= 2 for e in graph.eqns for v in e.outvars)
    assert {v.type.dtype for v in graph.invars} <= {dt.float32, dt.int32, dt.bool_}


@given(programs())
def test_every_result_is_used_or_returned(graph):
    used = {a.id for e in graph.eqns for a in e.inputs if isinstance(a, Var)}
    outs = {a.id for a in graph.outvars}
    assert all(e.outvars[0].id in used | outs for e in graph.eqns)


@given(programs(primitives={"mul", "exp", "log"}, dtypes=(dt.float16,)))
def test_programs_use_only_the_chosen_primitives_and_dtypes(graph):
    assert {e.primitive for e in graph.eqns} <= {"mul", "exp", "log"} | HELPER_PRIMITIVES
    assert all(a.type.dtype == dt.float16 for e in graph.eqns for a in e.inputs + e.outvars)


@pytest.mark.parametrize("primitive", sorted(n for n, p in PRIMITIVES.items() if not p.opaque))
def test_programs_cover_every_primitive(primitive):
    """Every primitive but the opaque ones (control flow and calls, tested in their own files)."""
    seen = []

    @settings(max_examples=8, derandomize=True, database=None, deadline=None)
    @given(programs(primitives={primitive}, dtypes=dt.ALL_DTYPES))
    def collect(graph):
        assert {e.primitive for e in graph.eqns} <= {primitive} | HELPER_PRIMITIVES
        seen.extend(e for e in graph.eqns if e.primitive == primitive)

    collect()
    assert seen


@given(st.data())
def test_graph_inputs_match_the_program(data):
    graph = data.draw(programs())
    inputs = data.draw(graph_inputs(graph))
    assert [(x.shape, x.dtype) for x in inputs] == [(v.type.shape, v.type.dtype.numpy) for v in graph.invars]


def _minimal(condition):
    return find(programs(), condition, settings=settings(database=None, max_examples=2000, derandomize=True))


def test_shrinks_to_one_equation():
    """The minimal program with a contraction is the contraction, possibly with the one
    equation that makes an operand of the shrunk dtype (the strategies draw every dtype)."""
    graph = _minimal(lambda g: any(e.primitive == "dot_general" for e in g.eqns))
    assert [e.primitive for e in graph.eqns][-1:] == ["dot_general"] and len(graph.eqns) <= 2


def test_shrinks_to_a_minimal_guarded_equation():
    graph = _minimal(lambda g: any(e.primitive == "log" for e in g.eqns))
    assert [e.primitive for e in graph.eqns] == ["abs", "add", "log"]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"primitives": {"add", "frobnicate"}}, "unknown primitives ['frobnicate']"),
    ({"min_inputs": 0}, "needs at least one input"),
])
def test_bad_program_parameters_are_glue_errors(kwargs, fragment):
    with pytest.raises(GlueError) as info:
        programs(**kwargs)
    assert fragment in str(info.value)
