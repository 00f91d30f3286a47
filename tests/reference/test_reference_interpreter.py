"""`run_graph`: argument order, the float64 mode, errors, and random programs evaluated natively
and in float64 agreeing within the tolerance of their dtypes."""
import numpy as np
import pytest
from hypothesis import given, note

from glue import GlueError
from glue.ir import dtypes as dt
from glue.ir import parse
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.testing import check_graph, programs_and_inputs, tolerance_dtypes

GRAPH = parse("""\
{ lambda a:f32[3] ; b:f32[3] c:f16[] . let
    d:f32[3] = sub b a
    e:f16[3] = convert_element_type[new_dtype=f16] d
    f:f16[3] = add e c
    g:f32[2,3] = iota[dimension=1 dtype=f32 shape=(2, 3)]
    h:i32[3] = convert_element_type[new_dtype=i32] d
  in (f, g, h, 1.5:f32) }""")


def test_constants_come_before_arguments():
    f, g, h, lit = run_graph(GRAPH, [np.float32([1, 2, 3]), np.float32([10, 20, 30.5]), np.float16(0.5)])
    assert f.dtype == np.float16 and f.tolist() == [9.5, 18.5, 28.0]
    assert g.dtype == np.float32 and g.tolist() == [[0, 1, 2]] * 2
    assert h.dtype == np.int32 and h.tolist() == [9, 18, 27]
    assert lit.dtype == np.float32 and lit.shape == () and lit == 1.5


def test_float64_mode_widens_floats_and_their_dtype_params():
    args = [np.float32([0, 0, 0]), np.float32([2048, 1, 2]), np.float16(1)]
    native = run_graph(GRAPH, args)
    wide = run_graph(GRAPH, args, float64=True)
    assert [a.dtype for a in wide] == [np.float64, np.float64, np.int32, np.float64]
    assert native[0][0] == 2048  # 2049 is not a float16
    assert wide[0][0] == 2049  # the f16 conversion is widened too
    assert mismatch(native[0], wide[0], dt.float16) is None


def test_wrong_number_of_arguments():
    with pytest.raises(GlueError, match=r"1 constants and 2 arguments \(3 values\), but got 2"):
        run_graph(GRAPH, [np.float32([1, 2, 3]), np.float16(0)])


def test_outputs_are_contiguous_arrays():
    graph = parse("{ lambda ; a:f32[2,3] . let\n    b:f32[3,2] = transpose[permutation=(1, 0)] a\n  in (b, a) }")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    b, a = run_graph(graph, [x])
    assert b.flags.c_contiguous and b.tolist() == x.T.tolist()
    assert np.array_equal(a, x)


def _agree_with_float64(graph, inputs):
    note(str(graph))
    native = run_graph(graph, inputs)
    wide = run_graph(graph, inputs, float64=True)
    for i, (got, want, dtype) in enumerate(zip(native, wide, tolerance_dtypes(graph))):
        assert np.all(np.isfinite(want.astype(np.float64))), f"output {i} is not finite"
        problem = mismatch(got, want, dtype)
        assert problem is None, f"output {i}: {problem}"


@given(programs_and_inputs())
def test_random_programs_agree_with_float64(program):
    _agree_with_float64(*program)


@given(programs_and_inputs(dtypes=(dt.bfloat16, dt.float16, dt.int32, dt.bool_), max_eqns=6))
def test_random_half_precision_programs_agree_with_float64(program):
    _agree_with_float64(*program)


@given(programs_and_inputs(dtypes=dt.ALL_DTYPES, max_inputs=4))
def test_random_programs_of_every_dtype_agree_with_float64(program):
    _agree_with_float64(*program)


@given(programs_and_inputs(max_eqns=5))
def test_the_reference_backend_runs_graphs_like_run_graph(program):
    check_graph(*program, backends=["reference"])
    check_graph(*program, backends=["reference"], float64_reference=False)
