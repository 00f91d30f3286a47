"""glue.numpy matmul, dot and einsum against NumPy, eagerly and under glue.jit, and their errors."""
from __future__ import annotations

import numpy as np
import pytest
from gnp_checks import BF16, arrays, check
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glue
import glue.numpy as gnp
from glue.errors import GlueTypeError

HERE = "test_numpy_contractions.py"


@st.composite
def matmul_operands(draw, dtype=np.float32):
    """Operands of a valid matmul: broadcastable batch dims, and 1-D operands now and then."""
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3))
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    a_shape = (k,) if draw(st.booleans()) else batch.input_shapes[0] + (m, k)
    b_shape = (k,) if draw(st.booleans()) else batch.input_shapes[1] + (k, n)
    return draw(arrays(a_shape, dtype, -3, 3)), draw(arrays(b_shape, dtype, -3, 3))


@given(ab=matmul_operands())
def test_matmul_matches_numpy(ab):
    check(gnp.matmul, np.matmul, *ab, dtype=np.float32, scale=4)
    check(lambda a, b: a @ b, np.matmul, gnp.asarray(ab[0]), ab[1], dtype=np.float32, scale=4)


@pytest.mark.parametrize("dtype", [np.int32, BF16])
@given(data=st.data())
def test_matmul_other_dtypes(dtype, data):
    a, b = data.draw(matmul_operands(dtype))
    check(gnp.matmul, np.matmul, a, b, dtype=dtype, scale=4)


@given(data=st.data())
def test_dot_matches_numpy(data):
    k = data.draw(st.integers(1, 4))
    a = data.draw(arrays(data.draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=3)).__add__((k,))))
    b_lead = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=3))
    b_shape = (k,) if not b_lead else b_lead[:-1] + (k,) + b_lead[-1:]
    b = data.draw(arrays(b_shape))
    check(gnp.dot, np.dot, a, b, dtype=np.float32, scale=10)
    check(gnp.dot, np.dot, a, np.float32(1.5), dtype=np.float32)


EINSUMS = {
    "bij,bjk->bik": [(2, 3, 4), (2, 4, 5)],
    "bhqd,bhkd->bhqk": [(2, 2, 3, 4), (2, 2, 5, 4)],
    "ij->ji": [(3, 4)],
    "...ij,jk->...ik": [(2, 3, 3, 4), (4, 5)],
    "ij->i": [(3, 4)],
    "ij->": [(3, 4)],
    "ij,j->i": [(3, 4), (4,)],
    "i,i->": [(5,), (5,)],
    "i,j->ij": [(3,), (4,)],
    "ij,jk,kl->il": [(2, 3), (3, 4), (4, 2)],
    "ij,jk": [(2, 3), (3, 4)],
    "ba": [(2, 3)],
    "bqhd,bkhd->bhqk": [(2, 3, 2, 4), (2, 5, 2, 4)],
    "bhqk,bkhd->bqhd": [(1, 2, 3, 5), (1, 5, 2, 4)],
    "...i,...i->...": [(2, 1, 3), (4, 3)],
    "ijk,ik->j": [(2, 3, 4), (2, 4)],
}


@pytest.mark.parametrize("subscripts", sorted(EINSUMS))
@given(data=st.data())
def test_einsum_matches_numpy(subscripts, data):
    operands = [data.draw(arrays(shape, np.float32, -3, 3)) for shape in EINSUMS[subscripts]]
    check(lambda *xs: gnp.einsum(subscripts, *xs), lambda *xs: np.einsum(subscripts, *xs), *operands,
          dtype=np.float32, scale=10)


def test_contractions_record_one_dot_general_without_broadcasts():
    x, w = np.ones((2, 3, 4), np.float32), np.ones((4, 5), np.float32)
    ir = str(glue.make_ir(gnp.matmul)(x, w))
    assert ir.count("dot_general") == 1 and "broadcast" not in ir and "transpose" not in ir
    ir = str(glue.make_ir(lambda a, b: gnp.einsum("...ij,jk->...ik", a, b))(x, w))
    assert ir.count("dot_general") == 1 and "transpose" not in ir
    q = np.ones((2, 2, 3, 4), np.float32)
    ir = str(glue.make_ir(lambda a, b: gnp.einsum("bhqd,bhkd->bhqk", a, b))(q, q))
    assert ir.count("dot_general") == 1 and "transpose" not in ir and "reduce" not in ir


def raises_naming(error, fn, *parts):
    with pytest.raises(error) as info:
        fn()
    for part in parts + (HERE,):
        assert part in str(info.value), f"{part!r} not in {str(info.value)!r}"


def test_contraction_errors():
    a, b = np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)
    for fn in (gnp.matmul, glue.jit(gnp.matmul, backend="reference"), lambda x, y: gnp.asarray(x) @ y):
        raises_naming(GlueTypeError, lambda: fn(a, b), "matmul", "f32[2,3]", "f32[4,5]", "3 vs 4")
    raises_naming(GlueTypeError, lambda: gnp.matmul(np.ones((2, 2, 3)), np.ones((3, 3, 4))), "matmul",
                  "f32[2,2,3]", "f32[3,3,4]", "batch")
    raises_naming(GlueTypeError, lambda: gnp.matmul(a, np.float32(2)), "matmul", "scalars")
    raises_naming(GlueTypeError, lambda: gnp.dot(a, b), "dot", "f32[2,3]", "f32[4,5]")
    raises_naming(GlueTypeError, lambda: gnp.einsum("ij,jk->ik", a, b), "einsum", "'j'", "sizes 3 and 4")
    raises_naming(GlueTypeError, lambda: gnp.einsum("ij,jk->ik", a), "einsum", "2 operands")
    raises_naming(GlueTypeError, lambda: gnp.einsum("ii->i", np.ones((3, 3))), "einsum", "diagonals")
    raises_naming(GlueTypeError, lambda: gnp.einsum("ij->iz", a), "einsum", "output")
    raises_naming(GlueTypeError, lambda: gnp.einsum("ijk->i", a), "einsum", "rank 2")
