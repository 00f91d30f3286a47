"""`glue.ir.parse` on malformed text: every failure is a ParseError (or, for text that parses, a
VerifyError from `verify`), never a raw Python exception; and whatever parses and verifies runs
on the reference interpreter without one either.

The texts are printed random programs (glue.testing) mutated by deleting, duplicating and
swapping characters and tokens: a few hundred mutants in CI, 20,000 under `thorough`.
"""
import re
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glue import GlueError, ParseError, VerifyError
from glue.ir import dtypes as dt
from glue.ir import parse, verify
from glue.reference import run_graph
from glue.testing import programs

THOROUGH = settings.get_current_profile_name() == "thorough"
PROGRAMS = 1000 if THOROUGH else 30
MUTANTS_PER_PROGRAM = 20 if THOROUGH else 10
# A mutant that parses runs on the reference when all its values together are this small.
RUN_LIMIT = 100_000

_TOKENS = re.compile(r"\w+|\s+|.", re.S)
_edit = st.tuples(st.sampled_from(["char", "token"]), st.sampled_from(["delete", "duplicate", "swap"]),
                  st.integers(0, 2 ** 20), st.integers(0, 2 ** 20))
_mutation = st.lists(_edit, min_size=1, max_size=3)


def mutate(text: str, edits) -> str:
    """`text` after each edit: delete the i-th character (token), duplicate the j-th one before
    it, or swap the two (positions taken modulo the length)."""
    for level, kind, i, j in edits:
        parts = list(text) if level == "char" else _TOKENS.findall(text)
        if not parts:
            return ""
        i, j = i % len(parts), j % len(parts)
        if kind == "delete":
            del parts[i]
        elif kind == "duplicate":
            parts.insert(i, parts[j])
        else:
            parts[i], parts[j] = parts[j], parts[i]
        text = "".join(parts)
    return text


def parse_or_glue_error(text: str) -> None:
    """Parse and verify `text`; if both succeed and the program is small, run it on zeros."""
    try:
        graph = parse(text)
        verify(graph)
    except (ParseError, VerifyError):
        return
    values = graph.constvars + graph.invars + tuple(v for e in graph.eqns for v in e.outvars)
    if sum(v.type.size for v in values) > RUN_LIMIT:
        return
    inputs = [np.zeros(v.type.shape, v.type.dtype.numpy) for v in graph.constvars + graph.invars]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # zeros divided by zeros, and such
        try:
            run_graph(graph, inputs)
        except GlueError:
            pass


@settings(max_examples=PROGRAMS)
@given(programs(dtypes=dt.ALL_DTYPES, max_eqns=12), st.lists(_mutation, min_size=MUTANTS_PER_PROGRAM,
                                                            max_size=MUTANTS_PER_PROGRAM))
def test_mutated_program_texts_fail_only_with_parse_or_verify_errors(graph, mutations):
    text = str(graph)
    for edits in mutations:
        parse_or_glue_error(mutate(text, edits))


_ONE = "{{ lambda ; a:{a} . let\n    {eqn}\n  in ({out}) }}"


@pytest.mark.parametrize("text, message", [
    (_ONE.format(a="i32[]", eqn="b:i32[] = add a inf:i32", out="b"), "inf is not an integer"),
    (_ONE.format(a="i32[]", eqn="b:i32[] = add a nan:i32", out="b"), "nan is not an integer"),
    (_ONE.format(a="i32[]", eqn="b:i32[] = add a 2.5:i32", out="b"), "2.5 is not an integer"),
    (_ONE.format(a="i32[]", eqn="b:i32[] = add a 1099511627777:i32", out="b"), "does not fit in i32"),
    (_ONE.format(a="i64[]", eqn="b:i64[] = add a 99999999999999999999:i64", out="b"), "does not fit in i64"),
    (_ONE.format(a="f32[]", eqn="b:f32[] = add a " + "9" * 400 + ":f32", out="b"), "too large for any float"),
    (_ONE.format(a="f32[2]", eqn="b:f32[2] = iota[dimension=0 dtype=5 shape=(2,)]", out="b"), "numeric dtype"),
    (_ONE.format(a="f32[2]", eqn="b:f32[] = dot_general[dimension_numbers=(1, 2)] a a", out="b"),
     "dimension_numbers must be"),
    (_ONE.format(a="f32[2]", eqn="b:f32[] = dot_general[dimension_numbers=(((0,), (0,)), ((), (), ()))] a a",
                 out="b"), "dimension_numbers must be"),
    (_ONE.format(a="f32[4]", eqn="b:f32[2] = slice[limit=(2,) start=(0.0,) strides=(1,)] a", out="b"),
     "start must be a tuple of ints"),
    (_ONE.format(a="f32[4]", eqn="b:f32[6] = pad[high=(1.0,) low=(1,) value=0.0] a", out="b"),
     "high must be a tuple of ints"),
    (_ONE.format(a="f32[2]", eqn="b:f32[2] = reshape[shape=" + "(" * 5000 + ")" * 5000 + "] a", out="b"),
     "nested deeper than"),
    (_ONE.format(a="f32[-2]", eqn="b:f32[-2] = neg a", out="b"), "negative dimension"),
    (_ONE.format(a="f32[4611686018427387904,8]", eqn="b:f32[4611686018427387904,8] = neg a", out="b"),
     "1 TiB"),
])
def test_malformed_texts_raise_parse_errors_that_say_why(text, message):
    with pytest.raises(ParseError, match=re.escape(message)):
        parse(text)


def test_parse_reads_only_text():
    with pytest.raises(ParseError, match="reads a str"):
        parse(b"{ lambda ; . let in () }")


def test_verify_rejects_bad_shapes_and_literals_of_graphs_built_in_code():
    from glue.ir import Eqn, Graph, Literal, TensorType, Var

    negative = Var(TensorType((-2,), dt.float32))
    with pytest.raises(VerifyError, match="negative dimension"):
        verify(Graph((), (negative,), (), (negative,)))
    x, y = Var(TensorType((), dt.int32)), Var(TensorType((), dt.int32))
    wrapped = Eqn("add", (x, Literal(2 ** 40 + 1, TensorType((), dt.int32))), (), (y,))
    with pytest.raises(VerifyError, match="does not fit in i32"):
        verify(Graph((), (x,), (wrapped,), (y,)))
