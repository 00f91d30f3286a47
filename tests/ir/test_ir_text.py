"""The IR's text form: exact printing, parsing back (`parse(str(g)) == g`) and parse errors."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, note

import glue
import glue.numpy as gnp
from glue import ParseError
from glue.ir import Eqn, Graph, Literal, TensorType, Var, infer_type, params_tuple, parse
from glue.ir import dtypes as dt
from glue.ir.printer import var_names
from glue.testing import programs

f32 = dt.float32


def _eqn(primitive, inputs, source=None, **params):
    out = Var(infer_type(primitive, tuple(a.type for a in inputs), params))
    return Eqn(primitive, tuple(inputs), params_tuple(params), (out,), source), out


def _literal(value, dtype=f32):
    return Literal(value, TensorType((), dtype))


def _sample_graph() -> Graph:
    c, x, w = Var(TensorType((3,), f32)), Var(TensorType((2, 3), f32)), Var(TensorType((3,), f32))
    e1, a = _eqn("broadcast_in_dim", [w], "model.py:12", shape=(2, 3), dims=(1,))
    e2, b = _eqn("add", [x, a])
    e3, d = _eqn("dot_general", [x, c], dimension_numbers=(((1,), (0,)), ((), ())))
    e4, e = _eqn("convert_element_type", [d], new_dtype=dt.bfloat16)
    e5, f = _eqn("pad", [e], low=(0,), high=(1,), value=-math.inf)
    e6, g = _eqn("gt", [b, _literal(0.5)])
    e7, h = _eqn("select", [g, b, _literal(math.nan)], "model.py:14")
    return Graph((c,), (x, w), (e1, e2, e3, e4, e5, e6, e7), (b, f, h, _literal(True, dt.bool_)))


GOLDEN = """\
{ lambda a:f32[3] ; b:f32[2,3] c:f32[3] . let
    d:f32[2,3] = broadcast_in_dim[dims=(1,) shape=(2, 3)] c # model.py:12
    e:f32[2,3] = add b d
    f:f32[2] = dot_general[dimension_numbers=(((1,), (0,)), ((), ()))] b a
    g:bf16[2] = convert_element_type[new_dtype=bf16] f
    h:bf16[3] = pad[high=(1,) low=(0,) value=-inf] g
    i:bool[2,3] = gt e 0.5:f32
    j:f32[2,3] = select i e nan:f32                      # model.py:14
  in (e, h, j, True:bool) }"""


def test_printer_golden_text():
    assert str(_sample_graph()) == GOLDEN


def test_golden_text_parses_back_to_the_same_graph():
    graph = parse(GOLDEN)
    assert graph == _sample_graph()
    assert str(graph) == GOLDEN
    assert [e.source for e in graph.eqns] == ["model.py:12", None, None, None, None, None, "model.py:14"]


def test_printing_an_empty_and_a_constant_only_graph():
    x = Var(TensorType((), dt.int32))
    assert str(Graph((), (), (), ())) == "{ lambda ; . let\n  in () }"
    assert str(Graph((x,), (), (), (x, _literal(-2, dt.int32)))) == "{ lambda a:i32[] ; . let\n  in (a, -2:i32) }"
    for text in ("{ lambda ; . let\n  in () }", "{ lambda a:i32[] ; . let\n  in (a, -2:i32) }"):
        assert str(parse(text)) == text


@given(programs(dtypes=dt.ALL_DTYPES))
def test_print_parse_round_trip(graph):
    text = str(graph)
    note(text)
    parsed = parse(text)
    assert parsed == graph
    assert str(parsed) == text


def test_traced_graphs_round_trip_with_their_source_lines():
    def f(x, w):
        y = gnp.tanh(x * w + 1.0)
        return y, x > 0.5, y.astype(np.float16)

    graph = glue.make_ir(f)(np.ones((2, 3), np.float32), np.ones(3, np.float32)).graph
    assert all(e.source and "test_ir_text.py" in e.source for e in graph.eqns)
    assert parse(str(graph)) == graph


def test_equality_is_up_to_renaming_only():
    x, y = Var(TensorType((2,), f32)), Var(TensorType((2,), f32))
    e1, a = _eqn("sub", [x, y])
    e2, b = _eqn("sub", [y, x])
    e3, c = _eqn("sub", [x, _literal(1.0)])
    e4, d = _eqn("sub", [x, _literal(2.0)])
    assert Graph((), (x, y), (e1,), (a,)) == Graph((), (y, x), (e2,), (b,))  # swapped names
    assert Graph((), (x, y), (e1,), (a,)) != Graph((), (x, y), (e2,), (b,))  # swapped operands
    assert Graph((), (x,), (e3,), (c,)) != Graph((), (x,), (e4,), (d,))
    assert Graph((), (x,), (e3,), (c,)) != Graph((), (x,), (e3,), (x,))


def test_var_names_skip_words_the_parser_reserves():
    names = list(itertools.islice(var_names(), 20000))
    assert names[:3] == ["a", "b", "c"] and names[26] == "ba"
    assert len(set(names)) == len(names)
    assert not {"in", "let", "lambda", "inf", "nan"} & set(names)


def test_a_long_chain_round_trips():
    x = Var(TensorType((), f32))
    eqns, value = [], x
    for _ in range(6000):  # passes the names "inf" and "nan"
        eqn, value = _eqn("neg", [value])
        eqns.append(eqn)
    graph = Graph((), (x,), tuple(eqns), (value,))
    assert parse(str(graph)) == graph


@pytest.mark.parametrize("value, dtype, text", [
    (1e-05, f32, "1e-05:f32"), (-0.0, f32, "-0.0:f32"), (math.inf, dt.float16, "inf:f16"),
    (-math.inf, f32, "-inf:f32"), (False, dt.bool_, "False:bool"), (2 ** 40, dt.int64, "1099511627776:i64"),
])
def test_literals_round_trip(value, dtype, text):
    x = Var(TensorType((2,), dtype))
    eqn, out = _eqn("max", [x, _literal(value, dtype)])
    graph = Graph((), (x,), (eqn,), (out,))
    assert text in str(graph)
    assert parse(str(graph)) == graph


HEADER = "{ lambda ; a:f32[2] . let\n"


@pytest.mark.parametrize("text, fragment, line", [
    (HEADER + "    b:f32[2] = neg c\n  in (b) }", "unknown variable or bad literal 'c'", 2),
    (HEADER + "    b:f32[3] = neg a\n  in (b) }", "neg produces f32[2], but the text declares f32[3]", 2),
    (HEADER + "    b:f32[2] = neg a\n    b:f32[2] = neg a\n  in (b) }", "variable 'b' is defined twice", 3),
    (HEADER + "    b:f32[2] = frob a\n  in (b) }", "unknown primitive 'frob'", 2),
    (HEADER + "    b:f32[2] = add a a a\n  in (b) }", "add: bad operands or parameters (3 operands", 2),
    (HEADER + "\n    b:f32[2] = reduce_sum[axes=(3,)] a\n  in (b) }", "axes (3,) out of range", 3),
    (HEADER + "    b:f32[2] = neg a $\n  in (b) }", "unexpected character '$'", 2),
    (HEADER + "    b:f32[2] = neg a\n  in (b)", "expected '}' but found nothing at the end of the text", None),
    ("{ lambda ; a:f99[2] . let\n  in (a) }", "unknown dtype 'f99'", 1),
    ("{ lambda ; a:f32[x] . let\n  in (a) }", "expected an integer but found 'x'", 1),
    ("{ lambda ; a:f32[2] a:f32[2] . let\n  in (a) }", "variable 'a' is defined twice", 1),
    ("{ lambada ; . let\n  in () }", "a graph starts with '{ lambda'", 1),
    ("{ lambda ; a:f32[2] . \n lett in (a) }", "expected 'let' after the arguments", 2),
    ("{ lambda ; . let\n  in () } extra", "expected the end of the text but found 'extra'", 2),
])
def test_parse_errors_say_what_and_where(text, fragment, line):
    with pytest.raises(ParseError) as info:
        parse(text)
    message = str(info.value)
    assert fragment in message
    if line is not None:
        assert message.endswith(f"at line {line}")


def test_every_dtype_has_a_spelling_that_parses_back():
    for d in dt.ALL_DTYPES:
        v = Var(TensorType((2,), d))
        largest = {"bool": True, "float": 65504.0, "int": int(np.iinfo(d.numpy).max) if d.is_int else 0}[d.kind]
        top = _literal(largest, d)
        text = str(Graph((), (v,), (), (v, top)))
        assert f"a:{d.name}[2]" in text and str(parse(text)) == text
    assert [d.name for d in dt.INT_DTYPES] == ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]
