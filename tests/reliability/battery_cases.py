"""The bad-input battery: programs a user might write that glue must refuse clearly, and a few
that it must run correctly where it once gave a silently wrong answer (issue 19).

Each `Case` is a snippet run by `battery_runner.py` in a subprocess, after `PRELUDE`. A case
that expects an error names the glue exception class it must raise (always a GlueError), the
things its message must name (the op, the shapes, the value), and marks with `#!` the line of
the snippet the message must point at. A case with `raises=None` must run to its end (its own
asserts check the answer). `lead` says which of the issue's items, done by the lead engineer,
a case waits for: it is a strict xfail until that part lands.
"""
from __future__ import annotations

from dataclasses import dataclass
from textwrap import dedent

PRELUDE = '''\
import os
import numpy as np
import glue
import glue.numpy as gnp
import glue.nn as nn
from glue.backend_cuda import CudaBackend


def run(backend, fn, *args):
    """fn on args: eagerly (on glue Arrays), through jit on a backend, or for cuda without a
    GPU traced and lowered to PTX."""
    if backend == "eager":
        return fn(*[gnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args])
    if backend == "cuda" and "cuda" not in glue.available_backends():
        return CudaBackend().lower(glue.make_ir(fn)(*args).graph, arch="sm_90").as_text("ptx")
    return glue.jit(fn, backend=backend)(*args)


x4 = np.arange(4, dtype=np.float32)
i4 = np.arange(4, dtype=np.int32)
x23 = np.ones((2, 3), np.float32)
'''


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    raises: str | None = "GlueError"
    names: tuple = ()        # each entry a string the message contains, or a tuple of alternatives
    line: bool = True        # the message names the `#!` line
    lead: str | None = None  # "item N": waits for the lead's part of issue 19
    needs: str | None = None  # "cuda" (a GPU), "cc" (a C compiler)

    @property
    def filename(self) -> str:
        return f"case_{self.name}.py"

    @property
    def source(self) -> str:
        return PRELUDE + dedent(self.code).strip() + "\n"

    @property
    def marked_line(self) -> int | None:
        for number, text in enumerate(self.source.splitlines(), 1):
            if text.rstrip().endswith("#!"):
                return number
        return None


CASES: list[Case] = []


def case(name: str, code: str, raises: str | None = "GlueError", *names, **facts) -> None:
    CASES.append(Case(name, code, raises, tuple(names), **facts))


# --- item 3: Python ints too large for their dtype, on every backend and eagerly ----------------

_INT_OPERANDS = [
    # name, the function, its argument, what the message names
    ("add", "lambda x: x + 2**40", "i4", ("add", "i32[4]", "1099511627776", "i32")),
    ("radd", "lambda x: 2**40 + x", "i4", ("add", "i32[4]", "1099511627776")),
    ("rsub", "lambda x: 2**40 - x", "i4", ("subtract", "i32[4]", "1099511627776")),
    ("mul_i64", "lambda x: x * 2**70", "i4.astype(np.int64)", ("multiply", "i64[4]", "1180591620717411303424")),
    ("add_i64", "lambda x: x + 2**63", "i4.astype(np.int64)", ("add", "i64[4]", "9223372036854775808")),
    ("maximum", "lambda x: gnp.maximum(x, -2**31 - 1)", "i4", ("maximum", "i32[4]", "-2147483649")),
    ("where", "lambda x: gnp.where(x > 0, x, 2**40)", "i4", ("where", "i32[4]", "1099511627776")),
    ("less", "lambda x: x < 2**40", "i4", ("less", "i32[4]", "1099511627776")),
    ("floor_divide", "lambda x: x // 2**33", "i4", ("floor_divide", "i32[4]", "8589934592")),
    ("full", "lambda x: gnp.full((4,), 2**40) + x", "i4", ("full", "1099511627776")),
    ("asarray", "lambda x: gnp.asarray(2**40) + x", "i4", ("asarray", "1099511627776")),
    ("pad_value", "lambda x: gnp.pad(x, 1, constant_values=2**40)", "i4", ("pad", "i32[4]", "1099511627776")),
    ("float_overflow", "lambda x: x + 2**1024", "x4", ("add", "f32[4]", "too large for any float")),
]
for _backend in ("eager", "reference", "cpu", "cuda"):
    for _name, _fn, _arg, _names in _INT_OPERANDS:
        # int64 operands stay int64 only with x64, as in JAX
        x64 = 'glue.config.update("jax_enable_x64", True)' if "int64" in _arg else "pass"
        case(f"int_{_name}_{_backend}", f"""
            {x64}
            f = {_fn}  #!
            run("{_backend}", f, {_arg})
        """, "GlueTypeError", *_names)
for _backend in ("reference", "cpu"):
    case(f"int_argument_{_backend}", f"""
        glue.jit(lambda x: x + 1, backend="{_backend}")(2**40)  #!
    """, "GlueTypeError", "1099511627776", "i32")
    case(f"int_argument_past_int64_{_backend}", f"""
        glue.jit(lambda x: x + 1, backend="{_backend}")(-2**70)  #!
    """, "GlueTypeError", "-1180591620717411303424", "i32")
for _backend in ("eager", "reference", "cpu"):
    case(f"int_weak_stays_weak_{_backend}", f"""
        glue.config.update("jax_enable_x64", True)  # int64 operands stay int64 only with x64
        y = run("{_backend}", lambda x: x + 3, x4.astype(np.float16))
        assert y.dtype == np.float16, y.dtype
        y = run("{_backend}", lambda x: x + 2**40, i4.astype(np.int64))
        assert y.dtype == np.int64 and (np.asarray(y) == np.arange(4) + 2**40).all(), y
        y = run("{_backend}", lambda x: x + (2**31 - 4), i4)
        assert y.dtype == np.int32 and (np.asarray(y) == np.arange(4) + 2**31 - 4).all(), y
    """, None)
for _backend in ("eager", "reference", "cpu"):
    case(f"int_in_a_list_{_backend}", f"""
        f = lambda x: x + gnp.asarray([2**40, 1, 2, 3])  #!
        run("{_backend}", f, i4)
    """, "GlueTypeError", "asarray", "1099511627776", "i32")
case("int_astype", """
    gnp.astype(2**40, np.int32)  #!
""", "GlueTypeError", "astype", "1099511627776", "i32")
case("int_arange", """
    glue.jit(lambda x: gnp.arange(4, dtype=np.int32) * 2**33 + x)(i4)  #!
""", "GlueTypeError", "8589934592", "i32")


# --- item 7: huge shapes fail at trace time, naming the op, the shape and the line -----------

_HUGE = [
    ("zeros", "lambda x: gnp.zeros((2**62, 8)) + x[0]", ("broadcast_in_dim", "(4611686018427387904, 8)", "1 TiB")),
    ("ones", "lambda x: gnp.ones((2**40, 2**10)) * x[0]", ("broadcast_in_dim", "(1099511627776, 1024)", "1 TiB")),
    ("full", "lambda x: gnp.full((2**31, 2**31), 1.0) + x[0]", ("(2147483648, 2147483648)", "1 TiB")),
    ("broadcast_to", "lambda x: gnp.broadcast_to(x, (2**41, 4))", ("broadcast_in_dim", "f32[4]", "(2199023255552, 4)")),
    ("arange", "lambda x: gnp.arange(2**45) + x[0]", ("iota", "(35184372088832,)", "1 TiB")),
    ("eye", "lambda x: gnp.eye(2**21) * x[0]", ("iota", "(2097152, 2097152)", "1 TiB")),
    ("outer", "lambda x: gnp.broadcast_to(x, (2**19, 4))[:, :, None] * gnp.ones((1, 1, 2**19))",
     ("(524288, 4, 524288)", "1 TiB")),
    ("pad", "lambda x: gnp.pad(x, 2**40)", ("pad", "f32[4]", "(2199023255556,)")),
    ("concatenate", "lambda x: gnp.concatenate([gnp.broadcast_to(x, (2**36, 4))] * 2)",
     ("concatenate", "f32[68719476736,4]", "(137438953472, 4)")),
    ("matmul", "lambda x: gnp.broadcast_to(x, (2**20, 4)) @ gnp.broadcast_to(x[:, None], (4, 2**20))",
     ("dot_general", "f32[1048576,4]", "f32[4,1048576]", "(1048576, 1048576)")),
    ("one_hot", "lambda x: nn.one_hot(x.astype(np.int32), 2**40)", ("1099511627776", "1 TiB")),
]
for _backend in ("eager", "reference", "cpu"):
    for _name, _fn, _names in _HUGE:
        case(f"huge_{_name}_{_backend}", f"""
            f = {_fn}  #!
            run("{_backend}", f, x4)
        """, "GlueTypeError", *_names)
case("huge_fails_when_lowered", """
    f = glue.jit(lambda x: gnp.zeros((2**62, 8)) + x[0], backend="cpu")  #!
    f.lower(x4)
""", "GlueTypeError", "broadcast_in_dim", "(4611686018427387904, 8)")


# --- item 4: glue.ir.parse raises ParseError for any text; verify rejects bad Graphs ------------

_ONE = "{{ lambda ; a:{a} . let\\n    {eqn}\\n  in ({out}) }}"
_PARSE = [
    ("inf_int", _ONE.format(a="i32[]", eqn="b:i32[] = add a inf:i32", out="b"), ("inf is not an integer", "line 2")),
    ("nan_int", _ONE.format(a="i32[]", eqn="b:i32[] = add a nan:i32", out="b"), ("nan is not an integer", "line 2")),
    ("float_int", _ONE.format(a="i32[]", eqn="b:i32[] = add a 2.5:i32", out="b"), ("2.5 is not an integer",)),
    ("wide_int", _ONE.format(a="i32[]", eqn="b:i32[] = add a 1099511627777:i32", out="b"), ("does not fit in i32",)),
    ("wide_i64", _ONE.format(a="i64[]", eqn="b:i64[] = add a 99999999999999999999:i64", out="b"),
     ("does not fit in i64",)),
    ("huge_float", _ONE.format(a="f32[]", eqn="b:f32[] = add a " + "9" * 400 + ":f32", out="b"),
     ("too large for any float",)),
    ("iota_dtype", _ONE.format(a="f32[2]", eqn="b:f32[2] = iota[dimension=0 dtype=5 shape=(2,)]", out="b"),
     ("iota", "numeric dtype")),
    ("dimension_numbers", _ONE.format(a="f32[2]", eqn="b:f32[] = dot_general[dimension_numbers=(1, 2)] a a", out="b"),
     ("dot_general", "dimension_numbers must be")),
    ("dimension_numbers_3", _ONE.format(
        a="f32[2]", eqn="b:f32[] = dot_general[dimension_numbers=(((0,), (0,)), ((), (), ()))] a a", out="b"),
     ("dot_general", "dimension_numbers must be")),
    ("float_slice", _ONE.format(a="f32[4]", eqn="b:f32[2] = slice[limit=(2,) start=(0.0,) strides=(1,)] a", out="b"),
     ("slice", "start must be a tuple of ints")),
    ("float_pad", _ONE.format(a="f32[4]", eqn="b:f32[6] = pad[high=(1.0,) low=(1,) value=0.0] a", out="b"),
     ("pad", "high must be a tuple of ints")),
    ("deep_parens", _ONE.format(a="f32[2]", eqn="b:f32[2] = reshape[shape=" + "(" * 5000 + ")" * 5000 + "] a",
                                out="b"), ("nested deeper than",)),
    ("negative_dim", _ONE.format(a="f32[-2]", eqn="b:f32[-2] = neg a", out="b"), ("negative dimension",)),
    ("huge_dim", _ONE.format(a="f32[4611686018427387904,8]", eqn="b:f32[4611686018427387904,8] = neg a", out="b"),
     ("1 TiB",)),
    ("unknown_primitive", _ONE.format(a="f32[2]", eqn="b:f32[2] = frobnicate a", out="b"), ("frobnicate",)),
    ("wrong_result_type", _ONE.format(a="f32[2]", eqn="b:f32[3] = neg a", out="b"), ("neg", "f32[3]")),
    ("stray_character", "{ lambda ; a:f32[2] . let\\n    b:f32[2] = neg a $\\n  in (b) }", ("'$'",)),
    ("truncated", "{ lambda ; a:f32[2] . let\\n    b:f32[2] = neg", ("neg", "0 operands")),
]
for _name, _text, _names in _PARSE:
    case(f"parse_{_name}", f"""
        glue.ir.parse("{_text}")
    """, "ParseError", *_names, line=False)
case("parse_bytes", """
    glue.ir.parse(b"{ lambda ; . let in () }")
""", "ParseError", "reads a str", line=False)
case("verify_negative_dim", """
    from glue.ir import Graph, TensorType, Var
    v = Var(TensorType((-2,), glue.ir.dtypes.float32))
    glue.ir.verify(Graph((), (v,), (), (v,)))
""", "VerifyError", "negative dimension", line=False)
case("verify_wrapped_literal", """
    from glue.ir import Eqn, Graph, Literal, TensorType, Var
    i32 = TensorType((), glue.ir.dtypes.int32)
    x, y = Var(i32), Var(i32)
    glue.ir.verify(Graph((), (x,), (Eqn("add", (x, Literal(2**40 + 1, i32)), (), (y,)),), (y,)))
""", "VerifyError", "add", "does not fit in i32", line=False)


# --- item 8: the raw exceptions that escaped ------------------------------------------------

for _backend in ("reference", "cpu"):
    case(f"mixed_dict_keys_{_backend}", f"""
        glue.jit(lambda d: d[1] + d["a"], backend="{_backend}")({{1: x4, "a": x4}})  #!
    """, "GlueError", "int", "str", "[1, 'a']")
case("mixed_dict_keys_tree_flatten", """
    glue.tree_flatten({1: x4, "a": x4, 2.5: x4})  #!
""", "GlueError", "float", "int", "str")
case("deep_pytree", """
    tree = x4
    for _ in range(5000):
        tree = [tree]
    glue.tree_flatten(tree)  #!
""", "GlueError", "recursion limit")
case("ragged_list_eager", """
    gnp.asarray([[1.0, 2.0], [3.0]])  #!
""", "GlueTypeError", "asarray", "inhomogeneous")
case("string_list_eager", """
    gnp.asarray(["a", "b"])  #!
""", "GlueTypeError", "asarray", "<U1")
for _backend in ("reference", "cpu"):
    case(f"ragged_list_in_jit_{_backend}", f"""
        f = lambda x: x[:2] + gnp.asarray([[1.0, 2.0], [3.0]])  #!
        run("{_backend}", f, x4)
    """, "GlueTypeError", "asarray", "inhomogeneous")
    case(f"nested_traced_list_in_jit_{_backend}", f"""
        y = run("{_backend}", lambda x: gnp.asarray([[x[0], x[1]], [x[2], x[3]]]), x4)
        assert np.asarray(y).tolist() == [[0, 1], [2, 3]], y
    """, None)
case("cpu_threads_not_a_number", """
    os.environ["GLUE_CPU_THREADS"] = "abc"
    glue.jit(lambda x: x + 1, backend="cpu")(x4)
""", "GlueError", "GLUE_CPU_THREADS", "'abc'", line=False)
case("cpu_threads_negative_means_one", """
    os.environ["GLUE_CPU_THREADS"] = "-3"
    assert (np.asarray(glue.jit(lambda x: x * 2, backend="cpu")(x4)) == x4 * 2).all()
""", None)
case("dump_directory_unwritable", """
    os.environ["GLUE_DUMP"] = "/proc/no/such/dir"
    glue.jit(lambda x: x + 1, backend="cpu")(x4)  #!
""", "GlueError", "GLUE_DUMP", "/proc/no/such/dir")
case("jit_nested_400_deep", """
    f = lambda x: x + 1
    for _ in range(400):
        f = (lambda g: lambda x: g(x) * 1.0)(glue.jit(f, backend="cpu"))
    try:
        y = glue.jit(f, backend="cpu")(x4)
    except glue.GlueError as err:  # a clear error is acceptable, a RecursionError is not
        assert "recursion limit" in str(err), err
    else:
        assert (np.asarray(y) == x4 + 1).all(), y
""", None)
case("jit_nested_3000_deep", """
    f = lambda x: x + 1
    for _ in range(3000):
        f = (lambda g: lambda x: g(x) * 1.0)(glue.jit(f, backend="reference"))  #!
    glue.jit(f, backend="reference")(x4)
""", "GlueError", "recursion limit")

_ARGUMENTS = [
    ("str", '"abc"', ("'abc'", "str")),
    ("object", "object()", ("object",)),
    ("complex", "1 + 2j", ("(1+2j)", "complex")),
    ("bytes", 'b"xy"', ("bytes",)),
    ("set", "{1, 2}", ("set",)),
    ("decimal", '__import__("decimal").Decimal("1.5")', ("Decimal",)),
    ("complex_array", "np.ones(2, np.complex64)", ("complex64", "(2,)")),
    ("string_array", 'np.array(["a", "b"])', ("<U1", "(2,)")),
    ("object_array", "np.array([1, None], dtype=object)", ("object", "(2,)")),
    ("datetime_array", 'np.array(["2024-01-01"], dtype="datetime64[D]")', ("datetime64", "(1,)")),
]
for _backend in ("reference", "cpu"):
    for _name, _value, _names in _ARGUMENTS:
        case(f"argument_{_name}_{_backend}", f"""
            glue.jit(lambda x, y: x + y, backend="{_backend}")(x4, {_value})  #!
        """, "GlueTypeError", *_names)
    case(f"operand_str_{_backend}", f"""
        f = lambda x: x + "a"  #!
        run("{_backend}", f, x4)
    """, "GlueTypeError", "'a'", "str")
    case(f"operand_none_{_backend}", f"""
        f = lambda x: gnp.maximum(x, None)  #!
        run("{_backend}", f, x4)
    """, "GlueTypeError", "None")
case("argument_named", """
    glue.jit(lambda x, y: x + y, backend="cpu")(x4, "abc")  #!
""", "GlueTypeError", ("args[1]", "argument y", "'y'"))
case("len_of_a_scalar", """
    f = lambda x: len(x)  #!
    glue.jit(f, backend="cpu")(np.float32(1))
""", "GlueTypeError", "len", "f32[]")


# --- item 1: donation (the lead's) -------------------------------------------------------------

for _backend in ("reference", "cpu"):
    case(f"donated_numpy_argument_is_not_mutated_{_backend}", f"""
        x = np.ones(4, np.float32)
        f = glue.jit(lambda x: x + 1.0, backend="{_backend}", donate_argnums=0)
        y1 = f(x)
        y2 = f(x)
        assert (x == 1).all(), x
        assert (np.asarray(y1) == 2).all() and (np.asarray(y2) == 2).all(), (y1, y2)
    """, None)
    case(f"donated_array_used_again_{_backend}", f"""
        a = gnp.asarray(np.ones(4, np.float32))
        f = glue.jit(lambda x: x + 1.0, backend="{_backend}", donate_argnums=0)
        y1 = f(a)
        f(a)  #!
    """, "GlueError", "donate")
    case(f"donated_array_leaves_earlier_outputs_alone_{_backend}", f"""
        a = gnp.asarray(np.ones(4, np.float32))
        f = glue.jit(lambda x: x + 1.0, backend="{_backend}", donate_argnums=0)
        y1 = f(a)
        try:
            f(a)
        except glue.GlueError:
            pass
        assert (np.asarray(y1) == 2).all(), y1
    """, None)
    case(f"donated_twice_in_one_call_{_backend}", f"""
        a = gnp.asarray(np.ones(4, np.float32))
        f = glue.jit(lambda x, y: x + y, backend="{_backend}", donate_argnums=(0, 1))
        try:
            y = f(a, a)
        except glue.GlueError:
            pass
        else:
            assert (np.asarray(y) == 2).all(), y
    """, None)


# --- item 5: static_argnums and donate_argnums out of range (the lead's) -------------------------

_ARGNUMS = [
    ("static_past_the_end", "static_argnums=5", ("static_argnums", "5")),
    ("donate_past_the_end", "donate_argnums=5", ("donate_argnums", "5")),
    ("static_negative_past_the_start", "static_argnums=-5", ("static_argnums", "-5")),
    ("donate_negative_past_the_start", "donate_argnums=-3", ("donate_argnums", "-3")),
    ("static_not_an_int", 'static_argnums="x"', ("static_argnums",)),
    ("donate_a_static", "static_argnums=1, donate_argnums=1", ("donate_argnums", "static_argnums")),
]
for _name, _spec, _names in _ARGNUMS:
    case(f"argnums_{_name}", f"""
        glue.jit(lambda x, y: x + y, backend="cpu", {_spec})(x4, x4)  #!
    """, "GlueError", *_names)
case("argnums_negative_counts_from_the_end", """
    f = glue.jit(lambda x, n: x * len(range(n)), backend="cpu", static_argnums=-1)
    assert (np.asarray(f(x4, 3)) == x4 * 3).all()
""", None)


# --- item 6: disk-cache entries are verified, not only checksummed (the lead's) ---------------

_CACHE_SETUP = """
    import glob, hashlib, tempfile
    from glue.backend_cpu.code import DISK
    os.environ["GLUE_CACHE_DIR"] = tempfile.mkdtemp()
    entries = lambda: set(glob.glob(os.path.join(DISK.directory(), "*", "*")))
    plus_one = lambda x: x + 1.0
    glue.jit(plus_one, backend="cpu")(x4)
    [mine] = entries()
"""
case("cache_entry_of_another_program", _CACHE_SETUP + """
    glue.jit(lambda x: x * 3.0, backend="cpu")(x4)
    [other] = entries() - {mine}
    os.replace(other, mine)  # a valid entry, holding the other program's code
    y = glue.jit(plus_one, backend="cpu")(x4)
    assert (np.asarray(y) == x4 + 1).all(), y
""", None)
case("cache_entry_of_garbage_with_a_valid_checksum", _CACHE_SETUP + """
    payload = bytes(range(256)) * 64
    with open(mine, "wb") as f:
        f.write(b"GLUECACHE2\\n" + hashlib.sha256(b"another key").digest() + hashlib.sha256(payload).digest()
                + payload)
    y = glue.jit(plus_one, backend="cpu")(x4)
    assert (np.asarray(y) == x4 + 1).all(), y
""", None)


# --- items 9 and 10: memory per compile, back-to-back GPU calls (the lead's) --------------------

case("memory_per_compile_is_returned", """
    import gc

    def resident():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def compile_and_drop(i):
        glue.jit(lambda x: x * float(i) + 1.0, backend="cpu")(x4)

    for i in range(10):
        compile_and_drop(i)
    gc.collect()
    before = resident()
    for i in range(10, 40):
        compile_and_drop(i)
    gc.collect()
    grown = resident() - before
    assert grown < 30 * 0.025 * 2**20, f"{grown / 2**20:.1f} MiB kept by 30 dropped programs"
""", None)
case("cuda_back_to_back_calls_with_live_outputs", """
    import time
    x = glue.device_put(np.ones((4096, 4096), np.float32), "cuda")
    b = glue.device_put(np.ones(4096, np.float32), "cuda")
    f = glue.jit(lambda x, b: nn.gelu(x + b), backend="cuda")
    f(x, b).block_until_ready()

    def per_call(keep):
        outs, t0 = [], time.perf_counter()
        for _ in range(50):
            y = f(x, b)
            if keep:
                outs.append(y)
            else:
                y.block_until_ready()
        y.block_until_ready()
        return (time.perf_counter() - t0) / 50
    alone, queued = min(per_call(False) for _ in range(3)), min(per_call(True) for _ in range(3))
    assert queued < 1.3 * alone, (queued, alone)
""", None, needs="cuda")


# --- item 2: long sums are right (once silently wrong) -------------------------------------------

case("sum_of_thirds_cpu", """
    x = np.full(2**25, 1 / 3, np.float32)
    got = float(np.asarray(glue.jit(gnp.sum, backend="cpu")(x)))
    want = float(np.sum(x, dtype=np.float64))
    assert abs(got - want) <= 4e-6 * want, (got, want)
""", None)
case("mean_of_ones_cpu", """
    assert float(np.asarray(glue.jit(gnp.mean, backend="cpu")(np.ones(2**25, np.float32)))) == 1.0
""", None)
case("column_sum_of_thirds_cpu", """
    x = np.full((2**22, 8), 1 / 3, np.float32)
    got = np.asarray(glue.jit(lambda x: x.sum(0), backend="cpu")(x))
    want = np.sum(x, 0, dtype=np.float64)
    assert (abs(got - want) <= 4e-6 * want).all(), (got, want)
""", None)
case("row_sum_of_thirds_cuda_emulated", """
    from tests.backend_cuda import emulator
    x = np.full((2, 2**21), 1 / 3, np.float32)
    program = CudaBackend().lower(glue.make_ir(lambda x: x.sum(-1))(x).graph, arch="sm_90", gemm="codegen")["llvm"]
    got = emulator.run_program(program, [x])[0]
    want = np.sum(x, -1, dtype=np.float64)
    assert (abs(got - want) <= 4e-6 * want).all(), (got, want)
""", None, needs="cc")


# --- everyday mistakes: each names the function, the shapes and the line --------------------------

_MISTAKES = [
    # name, the function, its arguments, the error class, what the message names
    ("add_shapes", "lambda x: x + x[:3]", "x4", "GlueTypeError", ("add", "f32[4]", "f32[3]")),
    ("matmul_shapes", "lambda x: x @ x[:, :2]", "x23", "GlueTypeError", ("matmul", "f32[2,3]", "f32[2,2]")),
    ("matmul_scalar", "lambda x: gnp.matmul(x, 2.0)", "x23", "GlueTypeError", ("matmul", "f32[2,3]")),
    ("dot_shapes", "lambda x: gnp.dot(x, x[:3])", "x4", "GlueTypeError", ("dot", "f32[4]", "f32[3]")),
    ("reshape_size", "lambda x: x.reshape(5)", "x4", "GlueTypeError", ("reshape", "f32[4]", "5")),
    ("reshape_two_unknowns", "lambda x: x.reshape(-1, -1)", "x4", "GlueTypeError", ("reshape", "f32[4]")),
    ("transpose_permutation", "lambda x: x.transpose((0, 0))", "x23", "GlueTypeError", ("transpose", "f32[2,3]")),
    ("sum_axis", "lambda x: x.sum(axis=3)", "x23", "GlueTypeError", ("sum", "f32[2,3]", "3")),
    ("mean_repeated_axis", "lambda x: x.mean(axis=(0, 0))", "x23", "GlueTypeError", ("mean", "f32[2,3]")),
    ("argmax_axis", "lambda x: x.argmax(axis=2)", "x4", "GlueTypeError", ("argmax", "f32[4]", "2")),
    ("concatenate_shapes", "lambda x: gnp.concatenate([x, x[:, :2]], axis=0)", "x23", "GlueTypeError",
     ("concatenate", "f32[2,3]", "f32[2,2]")),
    ("stack_shapes", "lambda x: gnp.stack([x, x[:3]])", "x4", "GlueTypeError", ("stack", "f32[4]", "f32[3]")),
    ("bitwise_on_floats", "lambda x: x & x", "x4", "GlueTypeError", ("bitwise_and", "f32[4]")),
    ("where_shapes", "lambda x: gnp.where(x[:3] > 0, x, x)", "x4", "GlueTypeError", ("where", "f32[4]", "bool[3]")),
    ("broadcast_to_shapes", "lambda x: gnp.broadcast_to(x, (3,))", "x4", "GlueTypeError", ("broadcast_to", "f32[4]")),
    ("expand_dims_axis", "lambda x: gnp.expand_dims(x, 5)", "x4", "GlueTypeError", ("expand_dims", "f32[4]", "5")),
    ("squeeze_size", "lambda x: gnp.squeeze(x, 0)", "x23", "GlueTypeError", ("squeeze", "f32[2,3]")),
    ("split_uneven", "lambda x: gnp.split(x, 3)", "x4", "GlueTypeError", ("split", "f32[4]", "3")),
    ("pad_negative", "lambda x: gnp.pad(x, -1)", "x4", "GlueTypeError", ("pad", "f32[4]", "-1")),
    ("einsum_sizes", "lambda x: gnp.einsum('ij,jk->ik', x, x)", "x23", "GlueTypeError", ("einsum", "f32[2,3]")),
    ("astype_complex", "lambda x: x.astype(np.complex64)", "x4", "GlueTypeError", ("complex64",)),
    ("unknown_dtype_name", "lambda x: gnp.zeros(3, dtype='float7') + x[0]", "x4", "GlueTypeError", ("float7",)),
    ("zeros_negative", "lambda x: gnp.zeros((-1, 2)) + x[0]", "x4", "GlueTypeError", ("zeros", "negative")),
    ("index_out_of_bounds", "lambda x: x[10]", "x4", "GlueIndexError", ("10", "f32[4]")),
    ("too_many_indices", "lambda x: x[0, 0]", "x4", "GlueIndexError", ("f32[4]",)),
    ("softmax_axis", "lambda x: nn.softmax(x, axis=5)", "x4", "GlueTypeError", ("f32[4]", "5")),
    ("layer_norm_weight", "lambda x: nn.layer_norm(x, gnp.ones(4))", "x23", "GlueTypeError", ("f32[2,3]", "f32[4]")),
    ("exp_of_str", "lambda x: gnp.exp('a') + x", "x4", "GlueTypeError", ("'a'", "str")),
]
for _backend in ("eager", "cpu"):
    for _name, _fn, _arg, _error, _names in _MISTAKES:
        case(f"mistake_{_name}_{_backend}", f"""
            f = {_fn}  #!
            run("{_backend}", f, {_arg})
        """, _error, *_names)

_TRACING = [
    ("bool_of_traced", "lambda x: x if x.sum() > 0 else -x", "ConcretizationError", ("bool()", "bool[]")),
    ("int_of_traced", "lambda x: x * int(x[0])", "ConcretizationError", ("int()", "f32[]")),
    ("numpy_of_traced", "lambda x: np.asarray(x) + 1", "ConcretizationError", ("NumPy", "f32[4]")),
    ("boolean_mask", "lambda x: x[x > 1]", "GlueIndexError", ("getitem", "f32[4]", "boolean mask")),
    ("range_of_traced", "lambda x: x * len(range(x[0].astype(np.int32)))", "ConcretizationError", ("i32[]",)),
]
for _name, _fn, _error, _names in _TRACING:
    case(f"tracing_{_name}", f"""
        f = {_fn}  #!
        glue.jit(f, backend="cpu")(x4)
    """, _error, *_names)
case("tracing_escaped_value", """
    kept = []
    glue.jit(lambda x: kept.append(x * 2) or x, backend="cpu")(x4)
    kept[0] + 1  #!
""", "GlueError", "escaped", "f32[4]")
case("static_argument_unhashable", """
    glue.jit(lambda x, n: x * len(n), backend="cpu", static_argnums=1)(x4, [1, 2])  #!
""", "GlueError", "hashable", "list")
case("compiled_for_other_arguments", """
    compiled = glue.jit(lambda x: x + 1, backend="cpu").lower(x4).compile()
    compiled(np.ones(5, np.float32))  #!
""", "GlueError", "compiled for other arguments", "f32[4]", "f32[5]")
case("grad_of_a_vector", """
    f = lambda x: x * 2
    glue.grad(f)(x4)  #!
""", "GlueTypeError", "grad", "f32[4]")
case("grad_of_an_integer_argument", """
    glue.grad(lambda x: (x * 2).sum())(i4)  #!
""", "GlueTypeError", "grad", "i32[4]")
case("vmap_sizes_differ", """
    glue.vmap(lambda a, b: a + b)(x23, np.ones((3, 3), np.float32))  #!
""", "GlueError", "vmap", "2", "3")
case("vjp_cotangent_shape", """
    _, pullback = glue.vjp(lambda x: x * 2, x4)
    pullback(np.ones(3, np.float32))  #!
""", "GlueError", "vjp", "f32[4]", "f32[3]")

BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "battery case names repeat"
