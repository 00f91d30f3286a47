"""Each primitive's shape/dtype rule, and the errors that name the primitive, the operand
types and the user's line."""
import inspect

import numpy as np
import pytest

import glue
from glue import GlueTypeError
from glue.frontend.tracing import bind
from glue.ir import PRIMITIVES, TensorType, infer_type
from glue.ir import dtypes as dt


def T(dtype, *shape):
    return TensorType(tuple(shape), dtype)


f32, f16, i32, i64, b = dt.float32, dt.float16, dt.int32, dt.int64, dt.bool_

VALID = [
    ("exp", [T(f16, 2, 3)], {}, T(f16, 2, 3)),
    ("neg", [T(i32, 4)], {}, T(i32, 4)),
    ("not", [T(b, 4)], {}, T(b, 4)),
    ("add", [T(f32, 2, 3), T(f32)], {}, T(f32, 2, 3)),  # rank 0 broadcasts implicitly
    ("add", [T(f32), T(f32, 5)], {}, T(f32, 5)),
    ("lt", [T(i64, 3), T(i64, 3)], {}, T(b, 3)),
    ("and", [T(i32, 3), T(i32, 3)], {}, T(i32, 3)),
    ("select", [T(b), T(f32, 2), T(f32, 2)], {}, T(f32, 2)),
    ("select", [T(b, 2), T(f32), T(f32)], {}, T(f32, 2)),
    ("convert_element_type", [T(f32, 2)], {"new_dtype": dt.bfloat16}, T(dt.bfloat16, 2)),
    ("reduce_sum", [T(f32, 2, 3, 4)], {"axes": (0, 2)}, T(f32, 3)),
    ("reduce_max", [T(b, 2, 3)], {"axes": ()}, T(b, 2, 3)),
    ("argmax", [T(f32, 2, 3)], {"axis": 1, "index_dtype": i64}, T(i64, 2)),
    ("broadcast_in_dim", [T(f32, 3, 1)], {"shape": (2, 3, 4), "dims": (1, 2)}, T(f32, 2, 3, 4)),
    ("reshape", [T(f32, 2, 6)], {"shape": (3, 4)}, T(f32, 3, 4)),
    ("transpose", [T(f32, 2, 3, 4)], {"permutation": (2, 0, 1)}, T(f32, 4, 2, 3)),
    ("slice", [T(f32, 10, 4)], {"start": (1, 0), "limit": (8, 4), "strides": (3, 1)}, T(f32, 3, 4)),
    ("pad", [T(i32, 2, 3)], {"low": (1, 0), "high": (2, 1), "value": 0}, T(i32, 5, 4)),
    ("concatenate", [T(f32, 2, 3), T(f32, 2, 1)], {"dimension": 1}, T(f32, 2, 4)),
    ("iota", [], {"dtype": i32, "shape": (2, 3), "dimension": 1}, T(i32, 2, 3)),
    ("dot_general", [T(f32, 5, 2, 3), T(f32, 5, 3, 4)], {"dimension_numbers": (((2,), (1,)), ((0,), (0,)))},
     T(f32, 5, 2, 4)),
    ("dot_general", [T(f32, 2), T(f32, 3)], {"dimension_numbers": (((), ()), ((), ()))}, T(f32, 2, 3)),
    ("gather", [T(f32, 5, 7), T(i32, 2, 3)], {"axis": 1, "batch_dims": 0}, T(f32, 5, 2, 3)),
    ("gather", [T(f32, 2, 5, 7), T(i32, 2, 4)], {"axis": 2, "batch_dims": 1}, T(f32, 2, 5, 4)),
    ("gather", [T(f32, 5, 7), T(i32)], {"axis": 0, "batch_dims": 0}, T(f32, 7)),
    ("scatter_add", [T(f32, 5, 7), T(i32, 3), T(f32, 3, 7)], {"axis": 0, "batch_dims": 0}, T(f32, 5, 7)),
]


@pytest.mark.parametrize("name, types, params, want", VALID)
def test_rules(name, types, params, want):
    assert infer_type(name, tuple(types), params) == want


def test_every_primitive_has_a_rule_and_a_kind():
    kinds = {"elementwise", "reduction", "index", "layout", "contraction", "creation", "call"}
    assert len(PRIMITIVES) >= 40
    assert all(p.kind in kinds and callable(p.rule) for p in PRIMITIVES.values())


INVALID = [
    ("add", [T(f32, 2), T(f32, 3)], {}, "operand shapes differ"),
    ("add", [T(f32, 2), T(f16, 2)], {}, "operand dtypes differ"),
    ("add", [T(b, 2), T(b, 2)], {}, "needs numeric operands"),
    ("exp", [T(i32, 2)], {}, "needs floating-point operands"),
    ("and", [T(f32, 2), T(f32, 2)], {}, "needs bool or integer operands"),
    ("select", [T(i32, 2), T(f32, 2), T(f32, 2)], {}, "the predicate must be bool"),
    ("reduce_sum", [T(f32, 2)], {"axes": (1,)}, "axes (1,) out of range for rank 1"),
    ("reduce_sum", [T(f32, 2, 2)], {"axes": (0, 0)}, "repeated axis"),
    ("argmax", [T(f32, 2)], {"axis": 0, "index_dtype": f32}, "index_dtype must be an integer dtype"),
    ("broadcast_in_dim", [T(f32, 3)], {"shape": (2, 4), "dims": (1,)}, "cannot broadcast to 4"),
    ("broadcast_in_dim", [T(f32, 3, 3)], {"shape": (3, 3), "dims": (1, 0)}, "must be increasing"),
    ("reshape", [T(f32, 2, 3)], {"shape": (4,)}, "cannot reshape 6 elements into (4,)"),
    ("transpose", [T(f32, 2, 3)], {"permutation": (0, 0)}, "is not a permutation"),
    ("slice", [T(f32, 4)], {"start": (2,), "limit": (5,), "strides": (1,)}, "out of bounds for size 4"),
    ("pad", [T(f32, 4)], {"low": (-1,), "high": (0,), "value": 0.0}, "padding must be non-negative"),
    ("concatenate", [T(f32, 2, 3), T(f32, 3, 3)], {"dimension": 1}, "differ outside the concatenated"),
    ("iota", [], {"dtype": b, "shape": (3,), "dimension": 0}, "iota needs a numeric dtype"),
    ("dot_general", [T(f32, 2, 3), T(f32, 4, 2)], {"dimension_numbers": (((1,), (0,)), ((), ()))},
     "lhs axis 1 (size 3) does not match rhs axis 0 (size 4)"),
    ("gather", [T(f32, 5), T(f32, 2)], {"axis": 0, "batch_dims": 0}, "indices must be integers"),
    ("gather", [T(f32, 2, 5), T(i32, 3, 1)], {"axis": 1, "batch_dims": 1}, "leading batch dimensions"),
    ("scatter_add", [T(f32, 5), T(i32, 2), T(f32, 3)], {"axis": 0, "batch_dims": 0}, "updates must have the shape"),
]


@pytest.mark.parametrize("name, types, params, fragment", INVALID)
def test_rule_errors_name_primitive_operands_and_problem(name, types, params, fragment):
    with pytest.raises(GlueTypeError) as info:
        infer_type(name, tuple(types), params)
    message = str(info.value)
    assert message.startswith(name)
    assert fragment in message
    assert ", ".join(map(str, types)) in message


def test_unknown_primitive_and_bad_params():
    with pytest.raises(GlueTypeError, match="unknown primitive 'frobnicate'"):
        infer_type("frobnicate", (), {})
    with pytest.raises(GlueTypeError, match=r"reduce_sum: bad operands or parameters .*\['axis'\]"):
        infer_type("reduce_sum", (T(f32, 2),), {"axis": 0})


def test_shape_errors_while_tracing_point_at_the_users_line():
    def f(x, y):
        return bind("add", x, y)

    line = inspect.getsourcelines(f)[1] + 1
    with pytest.raises(GlueTypeError) as info:
        glue.jit(f)(np.ones(2, np.float32), np.ones(3, np.float32))
    message = str(info.value)
    assert "add on (f32[2], f32[3]): operand shapes differ" in message
    assert f"test_ir_primitives.py:{line}" in message
    assert 'return bind("add", x, y)' in message  # the source text of that line


def test_shape_errors_in_eager_code_point_at_the_users_line():
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(GlueTypeError, match=rf"dot_general.*\(f32\[2,3\], f32\[2,3\]\).*test_ir_primitives.py:{line}"):
        bind("dot_general", np.ones((2, 3), np.float32), np.ones((2, 3), np.float32),
             dimension_numbers=(((1,), (0,)), ((), ())))
