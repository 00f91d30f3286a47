"""Structured control flow, as JAX's lax has it: scan, map, fori_loop, while_loop, cond, switch.

Each traces its Python functions once into body Graphs (pytrees of arrays in and out) and binds
one primitive holding them, so a loop over a stacked model compiles one step, not one per
iteration. Bodies may read any value of the enclosing program (it becomes an operand) and may
print (`glue.debug.print`); every use of these functions is checked, and a mismatch of
structures, shapes or dtypes is a GlueError naming the function and the offending value.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Sequence

import numpy as np

from glue.errors import GlueTypeError, describe_location, user_frame_location
from glue.frontend.bodies import Body, trace_body, token_operands
from glue.frontend.pytree import PyTreeDef, leaf_paths, tree_flatten, tree_unflatten
from glue.frontend.tracing import Tracer, bind, type_of
from glue.ir import TensorType, Var
from glue.ir import dtypes as dt
from glue.ir.primitives import TOKEN


def _where() -> str:
    return describe_location(user_frame_location())


def _fail(fn: str, message: str) -> GlueTypeError:
    return GlueTypeError(f"{fn}: {message} {_where()}")


def _check_types(fn: str, what: str, tree: PyTreeDef, got: Sequence[TensorType],
                 want: Sequence[TensorType]) -> None:
    for path, g, w in zip(leaf_paths(tree, what), got, want):
        if g != w:
            raise _fail(fn, f"{path} is {g} but must stay {w} (the type it starts with); "
                            "cast it with .astype to keep the type")


def _check_tree(fn: str, what: str, got: PyTreeDef, want: PyTreeDef) -> None:
    if got != want:
        raise _fail(fn, f"{what} has the structure {got}, but it must have the structure {want}")


def _flat_fn(fn: Callable[[Any], Any], in_tree: PyTreeDef, out_trees: list[PyTreeDef]) -> Callable:
    """`fn` of one pytree (of structure `in_tree`) as a function of flat leaves returning flat
    leaves; each call appends its output's structure to `out_trees`."""
    def flat(*leaves: Any) -> list[Any]:
        out_leaves, tree = tree_flatten(fn(tree_unflatten(in_tree, list(leaves))))
        out_trees.append(tree)
        return out_leaves
    return flat


def _with_token(body: Body, effects: bool) -> list[Var]:
    """The body's argument vars, with an unused token input in front when the equation has
    effects that this body does not (a branch that does not print beside one that does)."""
    args = list(body.arg_vars)
    return ([Var(TOKEN)] + args) if effects and not body.effects else args


# --- scan -----------------------------------------------------------------------------------

def _scan_length(fn: str, x_tree: PyTreeDef, x_types: Sequence[TensorType], length: Any) -> int:
    if length is not None:
        if not isinstance(length, numbers.Integral) or isinstance(length, bool) or length < 0:
            raise _fail(fn, f"length must be a non-negative int, not {length!r}")
        length = int(length)
    lengths = {}
    for path, t in zip(leaf_paths(x_tree, "xs"), x_types):
        if not t.shape:
            raise _fail(fn, f"{path} is a scalar ({t}); every leaf of xs is scanned along its leading axis")
        lengths[path] = t.shape[0]
    found = set(lengths.values())
    if len(found) > 1 or (found and length is not None and found != {length}):
        shown = ", ".join(f"{p} has {n}" for p, n in lengths.items())
        also = f" and length={length}" if length is not None else ""
        raise _fail(fn, f"the leading axes of xs differ ({shown}{also})")
    if length is None and not found:
        raise _fail(fn, "with no xs to scan, length must be given")
    return found.pop() if found else length


def scan(f: Callable, init: Any, xs: Any = None, length: int | None = None, reverse: bool = False,
         unroll: int | bool = 1, _split_transpose: bool = False) -> tuple[Any, Any]:
    """`(carry, ys)` of `f` applied along the leading axis of `xs` (as jax.lax.scan):

        carry = init
        for x in xs:                  # reversed(xs) with reverse=True
            carry, y = f(carry, x)
            ys.append(y)              # stacked along a new leading axis

    `f` is traced once; `init` and the carry it returns must have the same structure and types.
    `unroll` is accepted for JAX's signature: the loop is a host loop over one compiled step
    (on a GPU, its launches repeated inside one CUDA graph), which unrolling would not speed up."""
    name = "scan"
    if not isinstance(unroll, (bool, numbers.Integral)) or (not isinstance(unroll, bool) and unroll < 1):
        raise _fail(name, f"unroll must be a positive int or a bool, not {unroll!r}")
    carry, carry_tree = tree_flatten(init)
    x_leaves, x_tree = tree_flatten(xs)
    carry_types = [type_of(c) for c in carry]
    x_types = [type_of(x) for x in x_leaves]
    n = _scan_length(name, x_tree, x_types, length)
    nc = len(carry)
    y_trees: list[PyTreeDef] = []

    def step(*leaves: Any) -> list[Any]:
        result = f(tree_unflatten(carry_tree, list(leaves[:nc])), tree_unflatten(x_tree, list(leaves[nc:])))
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise _fail(name, f"the scanned function must return a pair (carry, y), not {type(result).__name__}")
        new_carry, new_tree = tree_flatten(result[0])
        _check_tree(name, "the carry the function returns", new_tree, carry_tree)
        ys, y_tree = tree_flatten(result[1])
        y_trees.append(y_tree)
        return new_carry + ys

    body = trace_body(step, carry_types + [TensorType(t.shape[1:], t.dtype) for t in x_types],
                      "the scan body")
    k = int(body.effects) + nc
    _check_types(name, "carry", carry_tree, body.out_types[int(body.effects):k], carry_types)
    args = body.arg_vars
    graph = body.with_invars(args[:k] + body.const_vars + args[k:])
    outs = bind("scan", *token_operands(body.effects), *carry, *body.consts, *x_leaves, body=graph,
                length=n, reverse=bool(reverse), num_carry=k, num_consts=body.n_consts)
    outs = outs[int(body.effects):]
    return tree_unflatten(carry_tree, outs[:nc]), tree_unflatten(y_trees[0], outs[nc:])


def map(f: Callable, xs: Any, *, batch_size: int | None = None) -> Any:  # noqa: A001 (JAX's name)
    """`f` applied to each slice of `xs` along its leading axis, the results stacked (as
    jax.lax.map: a scan without a carry). `batch_size` maps `f` with vmap over chunks of that
    many slices, which needs the length to be a multiple of it."""
    if batch_size is None:
        return scan(lambda carry, x: ((), f(x)), (), xs)[1]
    from glue.frontend.transforms import vmap

    leaves, tree = tree_flatten(xs)
    n = _scan_length("map", tree, [type_of(x) for x in leaves], None)
    if not isinstance(batch_size, numbers.Integral) or batch_size < 1 or n % batch_size:
        raise _fail("map", f"batch_size={batch_size!r} must be a positive divisor of the length {n}")
    chunks = [bind("reshape", x, shape=(n // batch_size, batch_size) + type_of(x).shape[1:]) for x in leaves]
    ys = scan(lambda carry, x: ((), vmap(f)(x)), (), tree_unflatten(tree, chunks))[1]
    y_leaves, y_tree = tree_flatten(ys)
    return tree_unflatten(y_tree, [bind("reshape", y, shape=(n,) + type_of(y).shape[2:]) for y in y_leaves])


# --- loops ----------------------------------------------------------------------------------

def _static_int(value: Any) -> int | None:
    """`value` as a Python int when it is known while tracing, else None."""
    if isinstance(value, Tracer):
        return None
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool):
        return int(value)
    array = np.asarray(value)
    return int(array) if array.shape == () and array.dtype.kind in "iu" else None


def fori_loop(lower: Any, upper: Any, body_fun: Callable, init_val: Any, *, unroll: int | bool | None = None) -> Any:
    """`body_fun(i, val)` for i in [lower, upper) (as jax.lax.fori_loop). With bounds known while
    tracing it is a scan (and so reverse-differentiable); with traced bounds, a while_loop."""
    lo, hi = _static_int(lower), _static_int(upper)
    index_dtype = dt.promote(type_of(lower).dtype, type_of(upper).dtype)
    if not index_dtype.is_int:
        raise _fail("fori_loop", f"the bounds must be integers, not {type_of(lower)} and {type_of(upper)}")
    cast = index_dtype.numpy.type
    if lo is not None and hi is not None:
        def step(carry, _):
            i, val = carry
            return (bind("add", i, cast(1)), body_fun(i, val)), ()

        (_, result), _ = scan(step, (cast(lo), init_val), None, length=max(hi - lo, 0), unroll=unroll or 1)
        return result

    def cond_fun(carry):
        return bind("lt", carry[0], carry[1])

    def body(carry):
        i, end, val = carry
        return bind("add", i, cast(1)), end, body_fun(i, val)

    start = bind("convert_element_type", lower, new_dtype=index_dtype)
    end = bind("convert_element_type", upper, new_dtype=index_dtype)
    return while_loop(cond_fun, body, (start, end, init_val))[2]


def while_loop(cond_fun: Callable, body_fun: Callable, init_val: Any) -> Any:
    """`val = body_fun(val)` while `cond_fun(val)` (as jax.lax.while_loop): `cond_fun` returns a
    bool scalar, `body_fun` a value of init_val's structure and types. It can be differentiated
    forward (jvp) but not in reverse: use scan or fori_loop with static bounds for that."""
    name = "while_loop"
    carry, tree = tree_flatten(init_val)
    types = [type_of(c) for c in carry]
    cond_trees: list[PyTreeDef] = []
    cond = trace_body(_flat_fn(cond_fun, tree, cond_trees), types, "the while_loop condition", token=False)
    pred = cond.out_types
    if cond_trees[0].kind != "leaf" or pred[0] != TensorType((), dt.bool_):
        shown = ", ".join(str(t) for t in pred) or "nothing"
        raise _fail(name, f"cond_fun must return a bool scalar, not {cond_trees[0]} of {shown}")
    body_trees: list[PyTreeDef] = []
    body = trace_body(_flat_fn(body_fun, tree, body_trees), types, "the while_loop body")
    _check_tree(name, "the value body_fun returns", body_trees[0], tree)
    _check_types(name, "the loop value", tree, body.out_types[int(body.effects):], types)
    effects = body.effects
    cond_graph = cond.with_invars(_with_token(cond, effects) + list(cond.const_vars))
    outs = bind("while", *token_operands(effects), *carry, *cond.consts, *body.consts, cond=cond_graph,
                body=body.graph, num_carry=int(effects) + len(carry), cond_consts=cond.n_consts)
    return tree_unflatten(tree, outs[int(effects):])


# --- branches -------------------------------------------------------------------------------

def cond(pred: Any, true_fun: Callable, false_fun: Callable, *operands: Any) -> Any:
    """`true_fun(*operands)` if `pred` else `false_fun(*operands)` (as jax.lax.cond): both are
    traced and must return the same structure and types; only the chosen one runs. `pred` is a
    scalar (bool, or a number compared with 0)."""
    t = type_of(pred)
    if t.shape != ():
        raise _fail("cond", f"the predicate must be a scalar, not {t} (use glue.numpy.where to choose "
                            "elementwise)")
    if t.dtype != dt.bool_:
        pred = bind("ne", pred, t.dtype.numpy.type(0))
    index = bind("convert_element_type", pred, new_dtype=dt.int32)
    return _branches("cond", index, (false_fun, true_fun), operands)


def switch(index: Any, branches: Sequence[Callable], *operands: Any) -> Any:
    """`branches[index](*operands)` (as jax.lax.switch), the index clamped into range."""
    branches = tuple(branches)
    if not branches:
        raise _fail("switch", "needs at least one branch")
    t = type_of(index)
    if t.shape != () or not (t.dtype.is_int or t.dtype == dt.bool_):
        raise _fail("switch", f"the index must be an integer scalar, not {t}")
    if len(branches) == 1:
        return branches[0](*operands)
    index = bind("convert_element_type", index, new_dtype=dt.int32)
    index = bind("max", bind("min", index, np.int32(len(branches) - 1)), np.int32(0))
    return _branches("switch", index, branches, operands)


def _branches(name: str, index: Any, funs: Sequence[Callable], operands: Sequence[Any]) -> Any:
    leaves, tree = tree_flatten(tuple(operands))
    types = [type_of(x) for x in leaves]
    out_trees: list[PyTreeDef] = []
    bodies = [trace_body(_flat_fn(lambda ops, fun=fun: fun(*ops), tree, out_trees), types, f"branch {k} of {name}")
              for k, fun in enumerate(funs)]
    for k, (body, out_tree) in enumerate(zip(bodies[1:], out_trees[1:]), start=1):
        _check_tree(name, f"the value branch {k} returns", out_tree, out_trees[0])
        got, want = body.out_types[int(body.effects):], bodies[0].out_types[int(bodies[0].effects):]
        for path, g, w in zip(leaf_paths(out_tree, "output"), got, want):
            if g != w:
                raise _fail(name, f"branch {k} returns {g} for {path}, but branch 0 returns {w}; the "
                                  "branches must return the same types")
    effects = any(b.effects for b in bodies)
    if effects:  # every branch then passes the token through
        bodies = [b if b.effects else trace_body(_passing_token(fun, tree), types, f"branch {k} of {name}",
                                                 token=True)
                  for k, (b, fun) in enumerate(zip(bodies, funs))]
    consts: list[Any] = [c for b in bodies for c in b.consts]
    graphs = []
    for k, body in enumerate(bodies):
        others = [[Var(v.type) for v in b.const_vars] for b in bodies]
        others[k] = list(body.const_vars)
        graphs.append(body.with_invars(list(body.arg_vars) + [v for vs in others for v in vs]))
    outs = bind("cond", *token_operands(effects), *leaves, *consts, index, branches=tuple(graphs))
    return tree_unflatten(out_trees[0], outs[int(effects):])


def _passing_token(fun: Callable, tree: PyTreeDef) -> Callable:
    def flat(token: Any, *leaves: Any) -> list[Any]:
        return [token] + tree_flatten(fun(*tree_unflatten(tree, list(leaves))))[0]
    return flat


__all__ = ["cond", "fori_loop", "map", "scan", "switch", "while_loop"]
