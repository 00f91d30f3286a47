"""glue.codegen.mathlib against NumPy: accuracy sweeps, special values, vector code, NVPTX.

Each function is compiled into a loop `void f(T* in, T* out, i64 n)` (pow reads two inputs),
optimised at O3 for the host CPU and run through MCJIT on NumPy arrays. References are NumPy's
float64 results (math.erf and math.erfc for erf and erfc); float32 results must be within 2 ulp
of the reference rounded to float32, float64 results within a relative error of 2e-15.
"""
import ctypes
import math
import re
import shutil
import subprocess

import llvmlite.binding as llvm
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from llvmlite import ir

from glue.backend import llvm_jobs
from glue.codegen import mathlib

F32_ULPS = 2
# The library's float64 error is below 1.5 ulp (3.3e-16); the margin is for the reference,
# since NumPy's SIMD float64 functions may themselves be a few ulps off.
F64_RELATIVE = 2e-15
SIN_COS_RANGE = {np.float32: 1e5, np.float64: 1e9}
DTYPES = (np.float32, np.float64)
IR_TYPES = {np.float32: ir.FloatType(), np.float64: ir.DoubleType()}
SWEEP = 1_000_000


def _logistic(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


REFERENCES = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log1p": np.log1p, "tanh": np.tanh, "logistic": _logistic,
    "erf": np.frompyfunc(math.erf, 1, 1), "erfc": np.frompyfunc(math.erfc, 1, 1), "sin": np.sin, "cos": np.cos, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "pow": np.power,
}


# ---- compiling and running --------------------------------------------------------------

def _elementwise_function(module, name, ty, arity):
    """`void name(ptr in_0, ..., ptr out, i64 n)` with blocks entry, body and done."""
    ptr, i64 = ir.PointerType(), ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * (arity + 1) + [i64]), name)
    for arg in fn.args[:-1]:
        arg.add_attribute("noalias")
    return fn, [fn.append_basic_block(label) for label in ("entry", "body", "done")]


def _compute_element(b, fn, ty, arity, emit, i):
    """out[i] = emit(in_0[i], ...)."""
    # NumPy guarantees element alignment only, also for the explicit-vector loops.
    scalar = ty.element if isinstance(ty, ir.VectorType) else ty
    align = 4 if isinstance(scalar, ir.FloatType) else 8
    xs = [b.load(b.gep(p, [i], source_etype=ty), typ=ty, align=align) for p in fn.args[:arity]]
    b.store(emit(b, *xs), b.gep(fn.args[arity], [i], source_etype=ty), align=align)


def _add_loop(module, name, ty, arity, emit):
    """A host loop: out[i] = emit(in_0[i], ...) for i < n."""
    fn, (entry, body, done) = _elementwise_function(module, name, ty, arity)
    i64 = ir.IntType(64)
    b = ir.IRBuilder(entry)
    n = fn.args[-1]
    b.cbranch(b.icmp_signed(">", n, i64(0)), body, done)
    b.position_at_end(body)
    i = b.phi(i64)
    i.add_incoming(i64(0), entry)
    _compute_element(b, fn, ty, arity, emit, i)
    following = b.add(i, i64(1))
    i.add_incoming(following, body)
    b.cbranch(b.icmp_signed("<", following, n), body, done)
    b.position_at_end(done)
    b.ret_void()


def _emitter(name):
    if name == "pow":
        return mathlib.emit_pow
    return lambda b, x: mathlib.emit_unary(b, name, x)


FUNCTIONS = sorted(mathlib.UNARY_FUNCTIONS) + ["pow"]
LANES = {np.float32: 8, np.float64: 4}


def _symbol(name, dtype, vector=False):
    return f"{name}_{np.dtype(dtype).name}{'_vec' if vector else ''}"


class Compiled:
    """The host-JIT'd module holding a scalar loop and an explicit-vector loop per function."""

    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.features = llvm.get_host_cpu_features()
        tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=self.features.flatten(), opt=3)
        module = ir.Module("mathlib_test")
        for name in FUNCTIONS:
            arity = 2 if name == "pow" else 1
            for dtype in DTYPES:
                ty = IR_TYPES[dtype]
                _add_loop(module, _symbol(name, dtype), ty, arity, _emitter(name))
                _add_loop(module, _symbol(name, dtype, True), ir.VectorType(ty, LANES[dtype]),
                          arity, _emitter(name))
        mod = llvm.parse_assembly(str(module))
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        tuning.slp_vectorization = True
        passes = llvm.create_pass_builder(tm, tuning)
        passes.getModulePassManager().run(mod, passes)
        self.declarations = [f.name for f in mod.functions if f.is_declaration]
        self.asm = tm.emit_assembly(mod)
        self.engine = llvm.create_mcjit_compiler(mod, tm)
        self.engine.finalize_object()

    def __call__(self, name, *inputs, vector=False):
        dtype = inputs[0].dtype.type
        inputs = [np.ascontiguousarray(a, dtype=dtype) for a in np.broadcast_arrays(*inputs)]
        out = np.empty_like(inputs[0])
        assert not vector or out.size % LANES[dtype] == 0
        count = out.size // LANES[dtype] if vector else out.size
        address = self.engine.get_function_address(_symbol(name, dtype, vector))
        fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (len(inputs) + 1), ctypes.c_int64)(address)
        fn(*[a.ctypes.data for a in inputs], out.ctypes.data, count)
        return out

    def function_asm(self, symbol):
        match = re.search(rf"^{symbol}:\n(.*?)^\.Lfunc_end", self.asm, re.S | re.M)
        return match.group(1)


@pytest.fixture(scope="module")
def jit():
    return Compiled()


# ---- comparing ----------------------------------------------------------------------------

def _reference(name, *inputs):
    with np.errstate(all="ignore"):
        return np.asarray(REFERENCES[name](*[a.astype(np.float64) for a in inputs]),
                          dtype=np.float64)


def _ordered(a):
    """float32 bit patterns mapped to integers that count ulps (-0 and +0 both map to 0)."""
    bits = a.view(np.int32).astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _errors(got, want):
    """Per element: ulps from the rounded reference (float32) or relative error (float64)."""
    both_nan = np.isnan(got) & np.isnan(want)
    if got.dtype == np.float32:
        with np.errstate(over="ignore"):
            want32 = want.astype(np.float32)
        err = np.abs(_ordered(got) - _ordered(want32)).astype(np.float64)
        err[np.isnan(got) != np.isnan(want32)] = np.inf
    else:
        with np.errstate(all="ignore"):
            err = np.abs(got - want) / np.maximum(np.abs(want), np.finfo(np.float64).tiny)
        err[got == want] = 0
        err[np.isnan(err)] = np.inf
    err[both_nan] = 0
    return err


def _check(jit, name, *inputs, mask=None):
    got = jit(name, *inputs)
    want = _reference(name, *inputs)
    err = _errors(got, want)
    if mask is not None:
        err = np.where(mask, err, 0)
    limit = F32_ULPS if got.dtype == np.float32 else F64_RELATIVE
    worst = int(np.argmax(err))
    assert err[worst] <= limit, (
        f"{name}({', '.join(repr(a.flat[worst]) for a in inputs)}) = {got.flat[worst]!r}, "
        f"reference {want.flat[worst]!r}: error {err[worst]:.3g} > {limit}")


# ---- inputs -------------------------------------------------------------------------------

def _rng():
    return np.random.default_rng(20261129)


def _positive_patterns(dtype, size):
    """Uniform over the encodings of the positive finite floats: every binade, subnormals too."""
    info = np.finfo(dtype)
    itype = np.uint32 if dtype == np.float32 else np.uint64
    top = int(np.array(info.max, dtype=dtype).view(itype))
    return _rng().integers(1, top, size=size, dtype=itype, endpoint=True).view(dtype)


def _edges(dtype):
    info = np.finfo(dtype)
    return np.array([0.0, -0.0, info.smallest_subnormal, -info.smallest_subnormal,
                     info.tiny, -info.tiny, info.eps, 1.0, -1.0, info.max, -info.max],
                    dtype=dtype)


def _sweep_inputs(name, dtype):
    info = np.finfo(dtype)
    big = float(info.max)
    exp_hi = math.log(big)
    exp_lo = math.log(float(info.smallest_subnormal)) - 1
    linear = {
        "exp": (exp_lo, exp_hi + 1), "exp2": (exp_lo / math.log(2), exp_hi / math.log(2) + 1),
        "expm1": (-45.0, exp_hi + 1), "tanh": (-20.0, 20.0), "logistic": (-20.0, 20.0),
        "erf": (-20.0, 20.0), "erfc": (-10.0, 30.0), "sin": (-SIN_COS_RANGE[dtype], SIN_COS_RANGE[dtype]),
        "cos": (-SIN_COS_RANGE[dtype], SIN_COS_RANGE[dtype]), "log1p": (-1.0, 1.0),
    }
    parts = [_edges(dtype)]
    if name in linear:
        parts.append(np.linspace(*linear[name], SWEEP, dtype=np.float64).astype(dtype))
    if name in ("log", "log2", "log1p", "sqrt", "rsqrt", "expm1", "tanh", "erf", "erfc", "logistic"):
        patterns = _positive_patterns(dtype, SWEEP)
        parts += [patterns, -patterns[: SWEEP // 4]]
    if name in ("log", "log2"):
        parts.append(np.linspace(0.5, 2.0, SWEEP // 4).astype(dtype))
    if name in ("sin", "cos"):
        parts.append(_near_multiples_of_half_pi(dtype))
        parts.append(np.linspace(-10, 10, SWEEP // 4).astype(dtype))
    return np.concatenate(parts)


def _near_multiples_of_half_pi(dtype):
    """Floats nearest to k*pi/2 within the guaranteed range and their neighbours: the
    arguments whose reduction cancels the most (all k for float32, a sample for float64)."""
    count = int(SIN_COS_RANGE[dtype] / (math.pi / 2))
    k = np.arange(1, count) if count < SWEEP else _rng().integers(1, count, SWEEP // 4)
    nearest = (k * (math.pi / 2)).astype(dtype)
    return np.concatenate([nearest, np.nextafter(nearest, dtype(0)),
                           np.nextafter(nearest, dtype(np.inf))])


def _pow_inputs(dtype):
    rng = _rng()
    limit = 80.0 if dtype == np.float32 else 700.0
    x = np.exp(rng.uniform(-12, 12, SWEEP))
    y = rng.uniform(-1, 1, SWEEP) * limit / np.maximum(np.abs(np.log(x)), 1e-3)
    y = np.clip(y, -1e4, 1e4)
    integer_y = rng.integers(-40, 41, SWEEP // 4).astype(np.float64)
    negative_x = -np.exp(rng.uniform(-2, 2, SWEEP // 4))
    near_one = 1 + rng.uniform(-1e-3, 1e-3, SWEEP // 4)
    near_one_y = rng.uniform(-1e4, 1e4, SWEEP // 4)
    xs = np.concatenate([x, negative_x, near_one]).astype(dtype)
    ys = np.concatenate([y, integer_y, near_one_y]).astype(dtype)
    return xs, ys


# ---- accuracy -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(mathlib.UNARY_FUNCTIONS))
def test_sweep(jit, name, dtype):
    x = _sweep_inputs(name, dtype)
    mask = np.abs(x) <= SIN_COS_RANGE[dtype] if name in ("sin", "cos") else None
    _check(jit, name, x, mask=mask)


def test_tanh_f32_just_below_powers_of_two(jit):
    """float32 tanh's worst cases (2.42 ulp of the exact result): x below 2^j by at most 2^2j,
    where tanh x stays below the power of two while e^2x - 1 has passed twice it."""
    windows = []
    for j in range(-11, -1):
        top = np.float32(2.0 ** j).view(np.uint32)
        count = min(1 << (j + 24), 1 << 17)
        windows.append(top - np.arange(1, count + 1, dtype=np.uint32))
    _check(jit, "tanh", np.concatenate(windows).view(np.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_stay_bounded_beyond_their_range(jit, name, dtype):
    x = _positive_patterns(dtype, SWEEP // 4)
    x = x[x > SIN_COS_RANGE[dtype]]
    assert np.all(np.abs(jit(name, np.concatenate([x, -x]))) <= 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_pow_sweep(jit, dtype):
    _check(jit, "pow", *_pow_inputs(dtype))


def _float_arrays(dtype):
    return hnp.arrays(dtype, st.integers(1, 64),
                      elements=st.floats(width=np.dtype(dtype).itemsize * 8))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(mathlib.UNARY_FUNCTIONS))
def test_random_floats(jit, name, dtype):
    @given(_float_arrays(dtype))
    def check(x):
        mask = np.abs(x) <= SIN_COS_RANGE[dtype] if name in ("sin", "cos") else None
        _check(jit, name, x, mask=mask)
    check()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_pow_random_floats(jit, dtype):
    @given(st.data())
    def check(data):
        x = data.draw(_float_arrays(dtype))
        y = data.draw(hnp.arrays(dtype, x.shape,
                                 elements=st.floats(width=np.dtype(dtype).itemsize * 8)))
        _check(jit, "pow", x, y)
    check()


# ---- special values -----------------------------------------------------------------------

INF, NAN = math.inf, math.nan
SPECIAL = {
    "exp": [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (1000.0, INF),
            (-1000.0, 0.0)],
    "exp2": [(0.0, 1.0), (3.0, 8.0), (-3.0, 0.125), (INF, INF), (-INF, 0.0), (NAN, NAN),
             (5000.0, INF), (-5000.0, 0.0)],
    "expm1": [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -1.0), (NAN, NAN), (1000.0, INF)],
    "log": [(1.0, 0.0), (0.0, -INF), (-0.0, -INF), (-1.0, NAN), (INF, INF), (-INF, NAN),
            (NAN, NAN)],
    "log2": [(1.0, 0.0), (8.0, 3.0), (0.125, -3.0), (0.0, -INF), (-2.0, NAN), (INF, INF),
             (NAN, NAN)],
    "log1p": [(0.0, 0.0), (-0.0, -0.0), (-1.0, -INF), (-2.0, NAN), (INF, INF), (-INF, NAN),
              (NAN, NAN)],
    "tanh": [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (1e30, 1.0)],
    "logistic": [(0.0, 0.5), (-0.0, 0.5), (INF, 1.0), (-INF, 0.0), (NAN, NAN)],
    "erf": [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (1e30, 1.0)],
    "erfc": [(0.0, 1.0), (-0.0, 1.0), (INF, 0.0), (-INF, 2.0), (NAN, NAN), (1e30, 0.0),
             (-1e30, 2.0), (30.0, 0.0)],
    "sin": [(0.0, 0.0), (-0.0, -0.0), (INF, NAN), (-INF, NAN), (NAN, NAN)],
    "cos": [(0.0, 1.0), (-0.0, 1.0), (INF, NAN), (-INF, NAN), (NAN, NAN)],
    "sqrt": [(0.0, 0.0), (-0.0, -0.0), (4.0, 2.0), (INF, INF), (-1.0, NAN), (NAN, NAN)],
    "rsqrt": [(0.0, INF), (-0.0, -INF), (4.0, 0.5), (INF, 0.0), (-1.0, NAN), (NAN, NAN)],
}
POW_SPECIAL = [  # (x, y, pow(x, y)) from C99 Annex F
    (NAN, 0.0, 1.0), (NAN, -0.0, 1.0), (2.0, 0.0, 1.0), (1.0, NAN, 1.0), (1.0, INF, 1.0),
    (-1.0, INF, 1.0), (-1.0, -INF, 1.0), (-2.0, 3.0, -8.0), (-2.0, 2.0, 4.0), (-2.0, -1.0, -0.5),
    (-8.0, 1 / 3, NAN), (-2.0, 0.5, NAN), (0.0, -1.0, INF), (-0.0, -1.0, -INF),
    (-0.0, -2.0, INF), (0.0, -0.5, INF), (-0.0, 3.0, -0.0), (-0.0, 2.0, 0.0), (0.0, 0.5, 0.0),
    (0.5, INF, 0.0), (0.5, -INF, INF), (2.0, INF, INF), (2.0, -INF, 0.0), (-0.5, INF, 0.0),
    (-INF, 3.0, -INF), (-INF, 2.0, INF), (-INF, -3.0, -0.0), (-INF, -2.0, 0.0),
    (-INF, 0.5, INF), (INF, 2.0, INF), (INF, -2.0, 0.0), (2.0, NAN, NAN), (NAN, 1.0, NAN),
    (-1.0, NAN, NAN), (10.0, 400.0, INF), (10.0, -400.0, 0.0), (-10.0, 401.0, -INF),
    (2.0, 10.0, 1024.0), (4.0, 0.5, 2.0), (2.0, -1074.0, 5e-324),
]


def _same(got, want):
    return np.isnan(got) == np.isnan(want) and (np.isnan(got) or (
        got == want and np.signbit(got) == np.signbit(want)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_special_values(jit, name, dtype):
    x, want = np.array(SPECIAL[name], dtype=dtype).T
    got = jit(name, x)
    bad = [(xi, gi, wi) for xi, gi, wi in zip(x, got, want) if not _same(gi, wi)]
    assert not bad, f"{name}: (x, got, want) {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_pow_special_values(jit, dtype):
    cases = [c for c in POW_SPECIAL if dtype == np.float64 or c[1] != -1074.0]
    x, y, want = np.array(cases, dtype=dtype).T
    got = jit("pow", x, y)
    bad = [(xi, yi, gi, wi) for xi, yi, gi, wi in zip(x, y, got, want) if not _same(gi, wi)]
    assert not bad, f"pow: (x, y, got, want) {bad}"


def test_subnormal_results(jit):
    for dtype in DTYPES:
        tiny = np.finfo(dtype).smallest_subnormal
        exponent = np.log2(tiny)
        assert jit("exp2", np.array([exponent], dtype=dtype))[0] == tiny
        assert jit("exp2", np.array([exponent - 1], dtype=dtype))[0] == 0
        assert jit("log2", np.array([tiny], dtype=dtype))[0] == exponent


# ---- code shape ---------------------------------------------------------------------------

def test_rejects_unknown_functions_and_types():
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    with pytest.raises(ValueError, match="cbrt"):
        mathlib.emit_unary(b, "cbrt", ir.Constant(ir.FloatType(), 1.0))
    with pytest.raises(TypeError, match="i32"):
        mathlib.emit_unary(b, "exp", ir.Constant(ir.IntType(32), 1))
    with pytest.raises(TypeError, match="one type"):
        mathlib.emit_pow(b, ir.Constant(ir.FloatType(), 1.0), ir.Constant(ir.DoubleType(), 1.0))


def test_each_routine_is_defined_once_per_module_and_type():
    """A use is one call of the module's routine for that function and type (the IR builder
    emits the polynomial once, however long the fused chain); the routines are internal and
    always inlined, so the optimised code has no calls (`test_no_external_calls`)."""
    module = ir.Module()
    f32, v8 = ir.FloatType(), ir.VectorType(ir.FloatType(), 8)
    fn = ir.Function(module, ir.FunctionType(f32, [f32, v8]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    x, v = fn.args
    y = mathlib.emit_unary(b, "tanh", mathlib.emit_unary(b, "tanh", x))
    mathlib.emit_unary(b, "tanh", v)
    mathlib.emit_pow(b, y, y)
    b.ret(y)
    routines = {g.name: g for g in module.functions if g.name.startswith("glue.math.")}
    assert sorted(routines) == ["glue.math.pow.f32", "glue.math.tanh.f32", "glue.math.tanh.v8f32"]
    for routine in routines.values():
        assert routine.linkage == "internal" and "alwaysinline" in routine.attributes
    calls = [i for i in fn.blocks[0].instructions if i.opname == "call"]
    assert [c.callee.name for c in calls] == ["glue.math.tanh.f32"] * 2 + ["glue.math.tanh.v8f32",
                                                                           "glue.math.pow.f32"]


def test_vector_operands_match_scalar_code(jit):
    for dtype in DTYPES:
        xs = np.concatenate([_edges(dtype), np.linspace(-30, 30, 1005, dtype=dtype)])
        ys = np.linspace(-5, 5, xs.size, dtype=dtype)
        for name in FUNCTIONS:
            args = (xs, ys) if name == "pow" else (xs,)
            np.testing.assert_array_equal(jit(name, *args, vector=True), jit(name, *args),
                                          err_msg=f"{name} {dtype.__name__}")


def test_no_external_calls(jit):
    assert all(name.startswith("llvm.") for name in jit.declarations), jit.declarations
    if jit.features.get("fma"):
        assert not re.search(r"^\s+call", jit.asm, re.M)


@pytest.mark.parametrize("name", ["exp", "tanh"])
def test_loops_vectorise(jit, name):
    if not jit.features.get("fma"):
        pytest.skip("host has no FMA; llvm.fma would be a libm call")
    # vectors as wide as the host has (AVX-512 hosts may still prefer 256 bits)
    register = "[yz]mm" if jit.features.get("avx512f") else "ymm" if jit.features.get("avx") else "xmm"
    asm = jit.function_asm(_symbol(name, np.float32))
    assert re.search(rf"vfmadd\w+ps\s+%{register}", asm), asm[:2000]


def _special_register(module, register):
    name = f"llvm.nvvm.read.ptx.sreg.{register}"
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(ir.IntType(32), []),
                                                   name)


def _add_kernel(module, name, ty, arity, emit):
    """A CUDA kernel: thread i < n computes out[i] = emit(in_0[i], ...)."""
    fn, (entry, body, done) = _elementwise_function(module, name, ty, arity)
    # LLVM 22 marks kernels by calling convention (it still upgrades !nvvm.annotations).
    fn.calling_convention = "ptx_kernel"
    b = ir.IRBuilder(entry)
    block, size, thread = (b.call(_special_register(module, register), [])
                           for register in ("ctaid.x", "ntid.x", "tid.x"))
    i = b.zext(b.add(b.mul(block, size), thread), ir.IntType(64))
    b.cbranch(b.icmp_signed("<", i, fn.args[-1]), body, done)
    b.position_at_end(body)
    _compute_element(b, fn, ty, arity, emit, i)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()


def _ptx_module():
    module = ir.Module("mathlib_ptx")
    module.triple = "nvptx64-nvidia-cuda"
    for name in FUNCTIONS:
        for dtype in DTYPES:
            _add_kernel(module, _symbol(name, dtype), IR_TYPES[dtype], 2 if name == "pow" else 1,
                        _emitter(name))
    return module


@pytest.fixture(scope="module")
def ptx():
    """The kernels' PTX, optimised at O3 as the cuda backend's modules are (which inlines the
    library's routines)."""
    return llvm_jobs.nvptx(str(_ptx_module()), "sm_90", "+ptx80", 3)[0]


def test_ptx_kernels(ptx):
    for name in FUNCTIONS:
        for dtype in DTYPES:
            assert f".entry {_symbol(name, dtype)}(" in ptx
    assert ".extern" not in ptx and not re.search(r"\bcall", ptx)


def test_ptxas_accepts(ptx, tmp_path):
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas is not installed")
    source = tmp_path / "mathlib.ptx"
    source.write_text(ptx)
    result = subprocess.run([ptxas, "-arch=sm_90", str(source), "-o", str(tmp_path / "out.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _checked(result):
    """The values of a cuda.bindings call, which returns (CUresult, *values)."""
    from cuda.bindings import driver
    assert result[0] == driver.CUresult.CUDA_SUCCESS, result
    return result[1] if len(result) == 2 else result[1:]


def _cuda_driver():
    """cuda.bindings' driver with device 0's primary context current, or a skip."""
    try:
        from cuda.bindings import driver
        (status,) = driver.cuInit(0)
    except Exception as exc:  # ImportError, or cuda.pathfinder's DynamicLibNotFoundError
        pytest.skip(f"no CUDA driver: {exc}")
    if status != driver.CUresult.CUDA_SUCCESS:
        pytest.skip(f"no usable CUDA device: {status}")
    device = _checked(driver.cuDeviceGet(0))
    _checked(driver.cuCtxSetCurrent(_checked(driver.cuDevicePrimaryCtxRetain(device))))
    return driver


def _run_kernel(driver, module, symbol, inputs):
    kernel = _checked(driver.cuModuleGetFunction(module, symbol.encode()))
    out = np.empty_like(inputs[0])
    buffers = [_checked(driver.cuMemAlloc(a.nbytes)) for a in (*inputs, out)]
    try:
        for a, buffer in zip(inputs, buffers):
            _checked(driver.cuMemcpyHtoD(buffer, a.ctypes.data, a.nbytes))
        args = [ctypes.c_uint64(int(buffer)) for buffer in buffers] + [ctypes.c_int64(out.size)]
        pointers = (ctypes.c_void_p * len(args))(*map(ctypes.addressof, args))
        _checked(driver.cuLaunchKernel(kernel, -(-out.size // 256), 1, 1, 256, 1, 1, 0, 0,
                                       ctypes.addressof(pointers), 0))
        _checked(driver.cuMemcpyDtoH(out.ctypes.data, buffers[-1], out.nbytes))
    finally:
        for buffer in buffers:
            _checked(driver.cuMemFree(buffer))
    return out


@pytest.mark.cuda
def test_gpu_matches_host_bitwise(jit, ptx):
    """Both targets run the same IEEE operations, so the results agree to the last bit."""
    driver = _cuda_driver()
    module = _checked(driver.cuModuleLoadData(ptx.encode() + b"\0"))
    for name in FUNCTIONS:
        for dtype in DTYPES:
            inputs = _pow_inputs(dtype) if name == "pow" else (_sweep_inputs(name, dtype),)
            got = _run_kernel(driver, module, _symbol(name, dtype), inputs)
            want = jit(name, *inputs)
            unsigned = f"u{got.itemsize}"
            same = (got.view(unsigned) == want.view(unsigned)) | (np.isnan(got) & np.isnan(want))
            bad = np.flatnonzero(~same)[:5]
            assert not bad.size, f"{_symbol(name, dtype)}: inputs {[a[bad] for a in inputs]} " \
                                 f"gpu {got[bad]} host {want[bad]}"
