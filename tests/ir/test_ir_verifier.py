"""The verifier accepts well-formed Graphs and names the first problem of ill-formed ones."""
import pytest
from hypothesis import given

from glue import VerifyError
from glue.ir import Eqn, Graph, Literal, TensorType, Var, verify
from glue.ir import dtypes as dt
from glue.testing import programs

V2 = TensorType((2,), dt.float32)


def _neg(x: Var, out: Var | None = None) -> Eqn:
    return Eqn("neg", (x,), (), (out or Var(x.type),))


@given(programs())
def test_generated_programs_verify(graph):
    verify(graph)


def test_use_before_definition():
    x, late = Var(V2), Var(V2)
    graph = Graph((), (x,), (_neg(late), _neg(x, late)), (late,))
    with pytest.raises(VerifyError, match=r"used before it is defined \(equation 0: neg\)"):
        verify(graph)


def test_undefined_output():
    x = Var(V2)
    with pytest.raises(VerifyError, match=r"used before it is defined \(graph outputs\)"):
        verify(Graph((), (x,), (), (Var(V2),)))


def test_wrong_declared_type():
    x = Var(V2)
    eqn = Eqn("neg", (x,), (), (Var(TensorType((3,), dt.float32)),))
    with pytest.raises(VerifyError, match=r"equation 0: neg: declares \['f32\[3\]'\], but the rule gives f32\[2\]"):
        verify(Graph((), (x,), (eqn,), eqn.outvars))


@pytest.mark.parametrize("make", [
    lambda x, y: Graph((), (x, x), (), (x,)),                                   # an input twice
    lambda x, y: Graph((x,), (x,), (), (x,)),                                   # constant and input
    lambda x, y: Graph((), (x,), (_neg(x, x),), (x,)),                          # redefines an input
    lambda x, y: Graph((), (x,), (_neg(x, y), _neg(x, y)), (y,)),               # two equations
])
def test_duplicate_definition(make):
    with pytest.raises(VerifyError, match="defined twice"):
        verify(make(Var(V2), Var(V2)))


def test_ill_typed_equation_names_the_primitive_and_types():
    x, y = Var(V2), Var(TensorType((3,), dt.float32))
    eqn = Eqn("add", (x, y), (), (Var(V2),))
    with pytest.raises(VerifyError, match=r"equation 0: add: add on \(f32\[2\], f32\[3\]\): operand shapes differ"):
        verify(Graph((), (x, y), (eqn,), eqn.outvars))


def test_non_scalar_literal():
    x = Var(V2)
    eqn = Eqn("add", (x, Literal(1.0, V2)), (), (Var(V2),))
    with pytest.raises(VerifyError, match="is not a scalar"):
        verify(Graph((), (x,), (eqn,), eqn.outvars))


def test_multiple_results_are_rejected():
    x = Var(V2)
    eqn = Eqn("neg", (x,), (), (Var(V2), Var(V2)))
    with pytest.raises(VerifyError, match="declares"):
        verify(Graph((), (x,), (eqn,), eqn.outvars))
