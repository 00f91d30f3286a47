"""lax.scan, map, fori_loop, while_loop, cond and switch: against Python loops over NumPy,
eagerly and under jit on the reference and cpu backends; grad against finite differences and
against the unrolled program; vmap against a loop over the batch; a model scanned over stacked
layers compiles one layer; the cpu backend runs a scan body on slices of xs in place."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue import lax
from glue.ir import parse, verify

BACKENDS = ["eager", "reference", "cpu"]

# The NumPy references compute in float64, so the programs keep their float64 inputs wide.
pytestmark = pytest.mark.usefixtures("x64")


def _run(fn, backend, *args):
    """`fn(*args)` eagerly or jitted on `backend`, as NumPy values."""
    out = fn(*args) if backend == "eager" else glue.jit(fn, backend=backend)(*args)
    return glue.tree_map(np.asarray, out)


def _close(got, want, backend, rtol=1e-5):
    got_leaves, got_tree = glue.tree_flatten(got)
    want_leaves, want_tree = glue.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol if backend == "cpu" else 1e-12,
                                   atol=1e-6 if backend == "cpu" else 1e-12)


def _rng(seed):
    return np.random.default_rng(seed)


# --- scan -----------------------------------------------------------------------------------

def _rnn_step(carry, x):
    h, count = carry["h"], carry["n"]
    new = gnp.tanh(h * 0.5 + x["a"] * x["b"])
    return {"h": new, "n": count + 1}, (new * 2.0, gnp.sum(new))


def _rnn_reference(carry, xs, reverse):
    h, n = np.asarray(carry["h"], np.float64), int(carry["n"])
    ys0, ys1 = [], []
    order = range(len(xs["a"]))
    for t in (reversed(order) if reverse else order):
        h = np.tanh(h * 0.5 + xs["a"][t] * xs["b"][t])
        n += 1
        ys0.append((t, h * 2.0))
        ys1.append((t, h.sum()))
    stack = lambda ys, like: (np.stack([y for _, y in sorted(ys, key=lambda p: p[0])])  # noqa: E731
                              if ys else np.zeros((0,) + like))
    return {"h": h, "n": n}, (stack(ys0, h.shape), stack(ys1, ()))


@pytest.mark.parametrize("backend", BACKENDS)
@given(seed=st.integers(0, 2**31), length=st.integers(0, 4), width=st.integers(1, 3), reverse=st.booleans())
def test_scan_matches_a_python_loop(backend, seed, length, width, reverse):
    rng = _rng(seed)
    init = {"h": rng.normal(size=width), "n": np.int32(3)}
    xs = {"a": rng.normal(size=(length, width)), "b": rng.normal(size=(length, 1))}

    def f(init, xs):
        return lax.scan(_rnn_step, init, xs, reverse=reverse)

    got = _run(f, backend, init, xs)
    want = _rnn_reference(init, xs, reverse)
    _close(got[0]["h"], want[0]["h"], backend)
    assert int(got[0]["n"]) == want[0]["n"]
    _close(got[1], want[1], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_without_xs_and_with_constants(backend):
    w = np.array([[0.5, -0.25], [0.75, 0.5]])

    def f(h):
        return lax.scan(lambda c, _: (gnp.tanh(c @ w), c.sum()), h, None, length=3)

    h = np.array([1.0, -1.0])
    got = _run(f, backend, h)
    want_h, want_ys = h, []
    for _ in range(3):
        want_ys.append(want_h.sum())
        want_h = np.tanh(want_h @ w)
    _close(got, (want_h, np.array(want_ys)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@given(seed=st.integers(0, 2**31), length=st.integers(1, 4), batch=st.sampled_from([None, 2]))
def test_map_matches_a_loop(backend, seed, length, batch):
    xs = _rng(seed).normal(size=(length * (batch or 1), 3))
    got = _run(lambda xs: lax.map(lambda x: gnp.sin(x) * x.sum(), xs, batch_size=batch), backend, xs)
    _close(got, np.stack([np.sin(x) * x.sum() for x in xs]), backend)


# --- loops ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@given(lo=st.integers(-2, 3), hi=st.integers(-2, 5), traced=st.booleans())
def test_fori_loop_matches_a_python_loop(backend, lo, hi, traced):
    def body(i, val):
        x, total = val
        return x * 0.5 + i, total + i

    def f(x, lo, hi):
        return lax.fori_loop(lo if traced else int(lo_), hi if traced else int(hi_), body, (x, 0))

    lo_, hi_ = lo, hi
    x, total = np.float64(1.5), 0
    for i in range(lo, hi):
        x, total = x * 0.5 + i, total + i
    got = _run(f, backend, np.float64(1.5), np.int32(lo), np.int32(hi))
    _close(got[0], x, backend)
    assert int(got[1]) == total


@pytest.mark.parametrize("backend", BACKENDS)
@given(seed=st.integers(0, 2**31), limit=st.floats(0.5, 20))
def test_while_loop_matches_a_python_loop(backend, seed, limit):
    start = _rng(seed).uniform(0.1, 1.0, size=2)

    def f(x, limit):
        return lax.while_loop(lambda c: c[1].sum() < limit, lambda c: (c[0] + 1, c[1] * 1.5 + 0.1), (0, x))

    n, x = 0, start.copy()
    while x.sum() < limit:
        n, x = n + 1, x * 1.5 + 0.1
    got = _run(f, backend, start, np.float64(limit))
    assert int(got[0]) == n
    _close(got[1], x, backend)


# --- branches -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@given(seed=st.integers(0, 2**31), pred=st.booleans())
def test_cond_matches_python(backend, seed, pred):
    rng = _rng(seed)
    x, y = rng.normal(size=3), rng.normal(size=(2, 3))

    def f(p, x, y):
        return lax.cond(p, lambda a, b: {"s": gnp.sin(a), "t": b * a}, lambda a, b: {"s": a - 1, "t": b + a}, x, y)

    want = {"s": np.sin(x), "t": y * x} if pred else {"s": x - 1, "t": y + x}
    _close(_run(f, backend, np.bool_(pred), x, y), want, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@given(seed=st.integers(0, 2**31), index=st.integers(-2, 5))
def test_switch_clamps_its_index(backend, seed, index):
    x = _rng(seed).normal(size=4)
    branches = [lambda v: v * 2, lambda v: gnp.exp(v), lambda v: -v]
    want = [x * 2, np.exp(x), -x][min(max(index, 0), 2)]
    _close(_run(lambda i, v: lax.switch(i, branches, v), backend, np.int32(index), x), want, backend)


# --- differentiation ------------------------------------------------------------------------

def _finite_difference(f, x, eps=1e-6):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (float(f(up)) - float(f(down))) / (2 * eps)
    return grad


def _scan_loss(w, h0, xs, scan=True):
    def step(h, x):
        h = gnp.tanh(h @ w + x)
        return h, (h * h).sum()
    if scan:
        h, ys = lax.scan(step, h0, xs)
        return h.sum() + ys.sum()
    total = 0.0
    for x in xs:  # the same program, unrolled
        h0, y = step(h0, x)
        total = total + y
    return h0.sum() + total


@given(seed=st.integers(0, 2**31), length=st.integers(0, 4))
def test_grad_of_scan_matches_finite_differences_and_the_unrolled_program(seed, length):
    rng = _rng(seed)
    w, h0, xs = rng.normal(size=(3, 3)) * 0.5, rng.normal(size=3), rng.normal(size=(length, 3))
    grads = glue.grad(_scan_loss, argnums=(0, 1, 2))(w, h0, xs)
    unrolled = glue.grad(lambda *a: _scan_loss(*a, scan=False), argnums=(0, 1, 2))(w, h0, xs)
    for g, u in zip(grads, unrolled):
        np.testing.assert_allclose(np.asarray(g), np.asarray(u), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(grads[0]), _finite_difference(lambda v: _scan_loss(v, h0, xs), w),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grads[2]), _finite_difference(lambda v: _scan_loss(w, h0, v), xs),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_grad_of_scan_compiles(backend):
    rng = _rng(1)
    args = [rng.normal(size=(3, 3)).astype(np.float32) * 0.5, rng.normal(size=3).astype(np.float32),
            rng.normal(size=(5, 3)).astype(np.float32)]
    got = glue.jit(glue.grad(_scan_loss, argnums=(0, 1, 2)), backend=backend)(*args)
    want = glue.grad(lambda *a: _scan_loss(*a, scan=False), argnums=(0, 1, 2))(*[a.astype(np.float64) for a in args])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


def test_the_vjp_of_scan_is_a_reverse_scan_over_saved_residuals():
    rng = _rng(2)
    ir = glue.make_ir(glue.grad(_scan_loss))(rng.normal(size=(3, 3)), rng.normal(size=3), rng.normal(size=(4, 3)))
    scans = [e for e in ir.graph.eqns if e.primitive == "scan"]
    assert [e.param_dict["reverse"] for e in scans] == [False, True]
    forward, backward = scans
    # the forward keeps per-iteration values beyond its own outputs: stacked, length first
    assert len(forward.outvars) > 2 and all(v.type.shape[0] == 4 for v in forward.outvars[1:])
    assert not any(e.primitive == "tanh" for e in backward.param_dict["body"].eqns)  # nothing recomputed


@given(seed=st.integers(0, 2**31), pred=st.booleans())
def test_grad_of_cond_matches_finite_differences(seed, pred):
    x = _rng(seed).normal(size=3)

    def loss(x, p):
        return lax.cond(p, lambda v: (gnp.sin(v) * v).sum(), lambda v: (v ** 3).sum(), x)

    g = glue.grad(loss)(x, np.bool_(pred))
    np.testing.assert_allclose(np.asarray(g), _finite_difference(lambda v: loss(v, np.bool_(pred)), x),
                               rtol=1e-5, atol=1e-7)
    unrolled = glue.grad(lambda v: (gnp.sin(v) * v).sum() if pred else (v ** 3).sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(unrolled), rtol=1e-12)
    compiled = glue.jit(glue.grad(loss), backend="cpu")(x.astype(np.float32), np.bool_(pred))
    np.testing.assert_allclose(np.asarray(compiled), np.asarray(g), rtol=1e-4, atol=1e-5)


def test_jvp_of_while_and_a_clear_error_for_its_grad():
    def f(x):
        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, gnp.sin(c[1])), (0, x))[1]

    out, tangent = glue.jvp(f, (np.float64(0.5),), (np.float64(1.0),))
    x, d = 0.5, 1.0
    for _ in range(3):
        x, d = np.sin(x), d * np.cos(x)
    assert float(out) == pytest.approx(x) and float(tangent) == pytest.approx(d)
    with pytest.raises(glue.GlueError, match="while_loop cannot be differentiated in reverse mode"):
        glue.grad(f)(0.5)


def test_stop_gradient_inside_a_scan_body():
    def loss(x):
        return lax.scan(lambda c, _: (c * glue.stop_gradient(c), None), x, None, length=2)[0]

    # c1 = sg(x) x, c2 = sg(c1) c1: d/dx = sg(c1) * sg(x) = x^3
    assert float(glue.grad(loss)(1.5)) == pytest.approx(1.5 ** 3)
    assert float(glue.jit(glue.grad(loss), backend="cpu")(np.float32(1.5))) == pytest.approx(1.5 ** 3)


# --- batching -------------------------------------------------------------------------------

def _loop(fn, *batched):
    return np.stack([np.asarray(fn(*example)) for example in zip(*batched)])


@given(seed=st.integers(0, 2**31))
def test_vmap_of_scan_cond_while_switch_fori_and_map(seed):
    rng = _rng(seed)
    h, xs = rng.normal(size=(3, 2)), rng.normal(size=(3, 4, 2))
    preds, limits = np.array([True, False, True]), np.array([2.0, 5.0, 9.0])
    index = np.array([0, 2, 1], np.int32)

    def scanned(h, xs):
        return lax.scan(lambda c, x: (gnp.tanh(c + x), c.sum()), h, xs)[1]

    def branched(p, h):
        return lax.cond(p, lambda v: v * 2, lambda v: gnp.sin(v), h)

    def looped(limit, h):
        return lax.while_loop(lambda c: c[0] < limit, lambda c: (c[0] + 1.0, c[1] * 1.1), (0.0, h))[1]

    def switched(i, h):
        return lax.switch(i, [lambda v: v, lambda v: v * 3, lambda v: -v], h)

    def counted(h):
        return lax.fori_loop(0, 3, lambda i, v: v * 0.5 + i, h)

    def mapped(xs):
        return lax.map(lambda x: x.sum(), xs)

    for fn, args in [(scanned, (h, xs)), (branched, (preds, h)), (looped, (limits, h)), (switched, (index, h)),
                     (counted, (h,)), (mapped, (xs,))]:
        np.testing.assert_allclose(np.asarray(glue.vmap(fn)(*args)), _loop(fn, *args), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(glue.jit(glue.vmap(fn), backend="cpu")(*args)), _loop(fn, *args),
                                   rtol=1e-6, atol=1e-6)
    # a batched predicate runs every branch and selects; an unbatched one stays a cond
    assert "select" in str(glue.make_ir(glue.vmap(branched))(preds, h))
    assert "cond" in str(glue.make_ir(glue.vmap(branched, in_axes=(None, 0)))(True, h))


def test_vmap_of_scan_with_shared_constants_keeps_them_unbatched():
    w = np.ones((2, 2))

    def f(h):
        return lax.scan(lambda c, _: (c @ w, None), h, None, length=2)[0]

    ir = glue.make_ir(glue.vmap(f))(np.ones((5, 2)))
    (scan,) = [e for e in ir.graph.eqns if e.primitive == "scan"]
    consts = scan.inputs[scan.param_dict["num_carry"]:][:scan.param_dict["num_consts"]]
    assert [a.type.shape for a in consts] == [(2, 2)]


# --- scanned models -------------------------------------------------------------------------

def _stacked_mlp(depth, width=16, seed=0):
    rng = _rng(seed)
    params = {"w": (rng.normal(size=(depth, width, width)) / np.sqrt(width)).astype(np.float32),
              "b": np.zeros((depth, width), np.float32)}
    return params, rng.normal(size=(8, width)).astype(np.float32)


def _mlp(params, x):
    def layer(h, p):
        return gnp.tanh(h @ p["w"] + p["b"]), None
    return (lax.scan(layer, x, params)[0] ** 2).mean()


def test_a_scanned_model_compiles_one_layer_whatever_its_depth():
    sizes = {}
    for depth in (2, 12):
        params, x = _stacked_mlp(depth)
        ir = glue.make_ir(_mlp)(params, x)
        compiled = glue.jit(glue.grad(_mlp), backend="cpu").lower(params, x).compile()
        sizes[depth] = (len(ir.graph.eqns), str(ir).count(" = "), len(compiled.kernels))
        got = compiled(params, x)
        want = glue.jit(glue.grad(_mlp), backend="reference")(params, x)
        for g, w in zip(glue.tree_flatten(got)[0], glue.tree_flatten(want)[0]):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)
    assert sizes[2] == sizes[12]


def test_the_cpu_backend_scans_slices_of_xs_in_place(monkeypatch):
    from glue.backend_cpu.runtime import Executable

    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    seen = []
    run_at = Executable.run_at

    def spy(self, arguments, results):
        seen.append(list(arguments))
        return run_at(self, arguments, results)

    monkeypatch.setattr(Executable, "run_at", spy)
    f = glue.jit(lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs), backend="cpu")
    carry, ys = f(np.zeros(3, np.float32), xs)
    np.testing.assert_array_equal(np.asarray(carry), xs.sum(0))
    base = xs.ctypes.data  # the argument itself: C-contiguous float32, passed as it is
    assert [args[1] for args in seen] == [base + t * 12 for t in range(4)]


# --- errors and the text form ---------------------------------------------------------------

def test_errors_name_the_function_and_the_value():
    with pytest.raises(glue.GlueTypeError, match=r"scan: carry\['h'\] is f32\[2\] but must stay f32\[\]"):
        lax.scan(lambda c, x: ({"h": c["h"] + x}, None), {"h": np.float32(0)}, np.ones((3, 2), np.float32))
    with pytest.raises(glue.GlueTypeError, match="leading axes of xs differ"):
        lax.scan(lambda c, x: (c, x), 0.0, (np.ones(3), np.ones(4)))
    with pytest.raises(glue.GlueTypeError, match="branch 1 returns"):
        lax.cond(True, lambda x: x, lambda x: x.astype(np.int32), np.float32(1))
    with pytest.raises(glue.GlueTypeError, match="cond_fun must return a bool scalar"):
        lax.while_loop(lambda c: c, lambda c: c + 1, 1.0)
    with pytest.raises(glue.GlueTypeError, match="predicate must be a scalar"):
        lax.cond(np.array([True, False]), lambda: 1.0, lambda: 2.0)


def test_control_flow_prints_and_parses_back():
    def f(x, p):
        c, ys = lax.scan(lambda c, x: (c + x, c * 2), 0.0, x)
        y = lax.cond(p, lambda a: a + 1, lambda a: a - 1, c)
        return lax.while_loop(lambda v: v < 100, lambda v: v * 3, y), ys

    closed = glue.make_ir(f)(np.ones(3, np.float32), True)
    graph = parse(str(closed))
    assert graph == closed.graph
    verify(graph)
