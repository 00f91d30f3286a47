"""Random programs on the cpu backend against the float64 NumPy reference.

Programs and inputs come from `glue.testing` (well-typed DAGs over every primitive, inputs on
exact grids, so results agree within each dtype's tolerance by construction); the examples run
through the whole pipeline: passes, fusion, memory plan, LLVM code generation, JIT, runtime.
Each example compiles a fresh module (about 0.1 s), so the counts here set this file's time.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np

from glue.backend_cpu import CpuBackend
from glue.ir import dtypes as dt
from glue.reference import run_graph
from glue.reference.compare import mismatch
from glue.settings import config
from glue.testing import check_graph, graph_inputs, programs, tolerance_dtypes

ALL_DTYPES = dt.ALL_DTYPES
# At least this many examples even under the quick `ci` profile; more under `thorough`.
EXAMPLES = max(400, settings.default.max_examples)


def _small_thresholds():
    """Take the paths meant for large work on small programs too: every contraction through the
    packed, register-blocked loops, every contiguous output through non-temporal row copies."""
    return config.override(cpu_matmul_min_work=0, cpu_stream_bytes=0)


@st.composite
def _programs_with_inputs(draw, **kwargs):
    graph = draw(programs(**kwargs))
    return graph, draw(graph_inputs(graph))


@settings(max_examples=EXAMPLES)
@given(_programs_with_inputs(dtypes=ALL_DTYPES, max_eqns=10))
def test_random_programs_match_the_reference(case):
    check_graph(*case, backends=["cpu"])


@settings(max_examples=EXAMPLES // 5)
@given(_programs_with_inputs(dtypes=(dt.float32, dt.int32, dt.bfloat16), max_eqns=8, max_rank=2, max_side=19))
def test_random_programs_on_rows_longer_than_a_vector(case):
    check_graph(*case, backends=["cpu"])


@settings(max_examples=EXAMPLES // 5)
@given(_programs_with_inputs(dtypes=(dt.float32, dt.float16, dt.float64), max_eqns=6, max_side=12,
                             primitives=("dot_general", "add", "mul", "tanh", "convert_element_type",
                                         "broadcast_in_dim", "transpose", "reduce_sum")))
def test_random_contractions_through_the_blocked_path(case):
    with _small_thresholds():
        check_graph(*case, backends=["cpu"])


@settings(max_examples=EXAMPLES // 5)
@given(_programs_with_inputs(dtypes=ALL_DTYPES, max_eqns=8, max_rank=2, max_side=19))
def test_random_programs_streaming_their_outputs(case):
    with _small_thresholds():
        check_graph(*case, backends=["cpu"])


@settings(max_examples=EXAMPLES // 5)
@given(_programs_with_inputs(dtypes=ALL_DTYPES, max_eqns=8, max_side=9))
def test_random_programs_with_every_argument_donated(case):
    graph, inputs = case
    expected = run_graph(graph, inputs, float64=True)
    lowered = CpuBackend().lower(graph, donated=tuple(range(len(graph.invars))))
    outs = lowered.compile()(*[np.array(x, copy=True) for x in inputs])
    for got, want, dtype in zip(outs, expected, tolerance_dtypes(graph)):
        problem = mismatch(np.asarray(got), want, dtype)
        assert problem is None, f"{problem}\n{graph}\n{lowered.as_text('memory')}"
