"""Integer semantics at full range on the cpu backend, against the reference (see
`integer_cases`): every group of primitives over every integer dtype."""
import pytest
from hypothesis import given, settings

from glue.backend_cpu import CpuBackend
from glue.ir import dtypes as dt
from glue.reference import run_graph
from tests.backend_cpu.integer_cases import CASES, case, same

EXAMPLES = max(2, settings.default.max_examples // 10)


@pytest.mark.parametrize("dtype", dt.INT_DTYPES, ids=str)
@pytest.mark.parametrize("group", sorted(CASES))
def test_full_range_integers_match_the_reference(group, dtype):
    @settings(max_examples=EXAMPLES)
    @given(case(group, dtype))
    def check(drawn):
        graph, args = drawn
        want = run_graph(graph, args)
        got = CpuBackend().lower(graph).compile()(*args)
        for i, (g, w) in enumerate(zip(got, want)):
            assert same(g, w), f"output {i} of\n{graph}\ninputs {args}\ngot {g!r}\nwant {w!r}"
    check()
