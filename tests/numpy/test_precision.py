"""JAX's matmul precision semantics: `precision=`, `preferred_element_type=`,
`glue.default_matmul_precision`; printed, parsed, part of the program; exact on the CPU."""
import ml_dtypes
import numpy as np
import pytest

import glue
import glue.lax as lax
import glue.numpy as gnp
from glue.ir import parse
from glue.reference.compare import tolerance_dtypes
from glue.ir import dtypes as dt

RNG = np.random.default_rng(0)
A = RNG.standard_normal((16, 32)).astype(np.float32)
B = RNG.standard_normal((32, 8)).astype(np.float32)


def _precisions(f, *args):
    return [e.param_dict["precision"] for e in glue.make_ir(f)(*args).graph.eqns if e.primitive == "dot_general"]


@pytest.mark.parametrize("given, recorded", [(None, "default"), ("highest", "highest"), ("float32", "highest"),
                                             ("tensorfloat32", "high"), (glue.Precision.HIGH, "high"),
                                             (("highest", "highest"), "highest"), ("bfloat16", "default")])
def test_every_spelling_is_recorded_canonically(given, recorded):
    for f in (lambda a, b: gnp.matmul(a, b, precision=given), lambda a, b: gnp.dot(a, b, precision=given),
              lambda a, b: gnp.einsum("ij,jk->ik", a, b, precision=given),
              lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=given)):
        assert _precisions(f, A, B) == [recorded]


def test_default_matmul_precision_is_a_context_and_a_setting():
    with glue.default_matmul_precision("highest"):
        assert _precisions(lambda a, b: a @ b, A, B) == ["highest"]
    with glue.config.override(default_matmul_precision="high"):
        assert _precisions(lambda a, b: a @ b, A, B) == ["high"]
    assert _precisions(lambda a, b: a @ b, A, B) == ["default"]


def test_precision_is_printed_parsed_and_part_of_the_program():
    default = glue.make_ir(lambda a, b: a @ b)(A, B).graph
    highest = glue.make_ir(lambda a, b: gnp.matmul(a, b, precision="highest"))(A, B).graph
    assert "precision=highest" in str(highest) and parse(str(highest)) == highest
    assert default != highest
    f = glue.jit(lambda a, b: a @ b, backend="cpu")
    a, b = glue.device_put(A, "cpu"), glue.device_put(B, "cpu")
    for _ in range(2):  # the second call takes the jit's fast path for Arrays
        f(a, b)
        with glue.default_matmul_precision("highest"):
            f(a, b)
    # the setting changes what tracing records, so it is part of the cache key
    assert sorted(e.param_dict["precision"] for c in f._compiled.values()
                  for e in c.lowered.closed.graph.eqns) == ["default", "highest"]


def test_bad_precisions_are_glue_errors():
    with pytest.raises(glue.GlueTypeError, match="unknown precision 'fast'"):
        gnp.matmul(A, B, precision="fast")
    with pytest.raises(glue.GlueTypeError, match="different precisions"):
        gnp.matmul(A, B, precision=("highest", "default"))
    with pytest.raises(glue.GlueTypeError, match="preferred_element_type bf16 must be"):
        gnp.matmul(A, B, preferred_element_type=ml_dtypes.bfloat16)


def test_preferred_element_type_widens_and_differentiates_like_jax():
    a, b = A.astype(ml_dtypes.bfloat16), B.astype(ml_dtypes.bfloat16)
    out = glue.jit(lambda a, b: gnp.matmul(a, b, preferred_element_type=np.float32), backend="cpu")(a, b)
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
    ga, gb = glue.grad(lambda a, b: gnp.matmul(a, b, preferred_element_type=np.float32).sum(), argnums=(0, 1))(a, b)
    assert ga.dtype == ml_dtypes.bfloat16 and gb.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(np.asarray(ga, np.float32), np.ones((16, 8)) @ b.astype(np.float32).T, rtol=1e-2)


def test_the_cpu_computes_full_float32_whatever_the_precision():
    want = A.astype(np.float64) @ B.astype(np.float64)
    for precision in ("default", "high", "highest"):
        got = glue.jit(lambda a, b: gnp.matmul(a, b, precision=precision), backend="cpu")(A, B)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_tf32_backends_compare_default_precision_at_bfloat16_tolerance():
    default = glue.make_ir(lambda a, b: gnp.tanh(a @ b))(A, B).graph
    highest = glue.make_ir(lambda a, b: gnp.tanh(gnp.matmul(a, b, precision="highest")))(A, B).graph
    assert tolerance_dtypes(default, tf32=True) == [dt.bfloat16]
    assert tolerance_dtypes(default, tf32=False) == [dt.float32]
    assert tolerance_dtypes(highest, tf32=True) == [dt.float32]
