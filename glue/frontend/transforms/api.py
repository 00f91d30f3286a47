"""The user-facing transforms, with JAX's signatures: grad, value_and_grad, vjp, jvp, vmap, and
the Jacobians built from them (jacfwd, jacrev, hessian).

Each flattens its arguments' pytrees, traces the function into a Graph of its own
(`trace_for_transform`), and hands the Graph to an interpreter (`autodiff`, `batching`) that
emits the transformed program into the context of the call: evaluated eagerly, or recorded
into the enclosing jit, grad or vmap trace. Transforms therefore compose in any order, and
`make_ir(grad(f))` shows the backward program. Symbolic-zero derivatives become arrays of
zeros only here, at the very end.
"""
from __future__ import annotations

import functools
import numbers
from typing import Any, Callable, Sequence

import numpy as np

from glue.errors import GlueError, GlueTypeError, describe_location, user_frame_location
from glue.frontend.array import Array
from glue.frontend.pytree import PyTreeDef, leaf_paths, tree_flatten, tree_unflatten
from glue.frontend.tracing import current_trace, type_of
from glue.frontend.transforms.autodiff import Linearized, jvp_graph
from glue.frontend.transforms.batching import batch_graph, move_batch
from glue.frontend.transforms.core import emit, zeros
from glue.frontend.transforms.stop_gradient import trace_for_transform
from glue.ir import ClosedGraph, TensorType


class TransformError(GlueError, ValueError):
    """A transform got arguments it cannot apply to (mismatched in_axes, tangents, cotangents)."""


def _name(fun: Callable) -> str:
    return getattr(fun, "__name__", type(fun).__name__)


def _where() -> str:
    return describe_location(user_frame_location())


def _trace(flat_fun: Callable[..., Any], in_types: Sequence[TensorType],
           name: str) -> tuple[ClosedGraph, PyTreeDef]:
    """Trace `flat_fun` (flat array arguments, any pytree out); its Graph and output structure."""
    out_trees: list[PyTreeDef] = []

    def flat(*leaves: Any) -> list[Any]:
        outs, tree = tree_flatten(flat_fun(*leaves))
        out_trees.append(tree)
        return outs

    closed = trace_for_transform(flat, in_types, name)
    return closed, out_trees[0]


def _split_aux(out_tree: PyTreeDef, has_aux: bool, name: str) -> tuple[PyTreeDef, PyTreeDef | None]:
    """The structure of the differentiated output, and of the auxiliary one."""
    if not has_aux:
        return out_tree, None
    if out_tree.kind not in ("tuple", "list") or len(out_tree.children) != 2:
        raise GlueTypeError(f"{name} with has_aux=True needs the function to return a pair "
                            f"(output, aux), but it returned the structure {out_tree} {_where()}")
    return out_tree.children[0], out_tree.children[1]


def _result(value: Any) -> Any:
    """Outside any trace, every output is a glue.Array (some come back as NumPy scalars)."""
    if current_trace() is not None or isinstance(value, Array):
        return value
    return Array(np.asarray(value, dtype=type_of(value).dtype.numpy))


def _outputs(tree: PyTreeDef, values: Sequence[Any]) -> Any:
    return tree_unflatten(tree, [_result(v) for v in values])


def _matching(value: Any, want: TensorType, what: str, other: str, name: str) -> Any:
    """A tangent or cotangent checked against the type it must have; a Python scalar takes it on."""
    if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic) and want.shape == ():
        return want.dtype.numpy.type(value)
    got = type_of(value)
    if got.shape != want.shape or (want.dtype.is_float and got.dtype != want.dtype):
        raise TransformError(f"{name}: {what} is {got}, but {other} is {want} {_where()}")
    return value


def _instantiate(values: Sequence[Any | None], types: Sequence[TensorType]) -> list[Any]:
    """Symbolic zeros (None) made into arrays of zeros."""
    return [zeros(t) if v is None else v for v, t in zip(values, types)]


# --- reverse mode ---------------------------------------------------------------------------

def vjp(fun: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """`(fun(*primals), vjp_fn)` (and `aux` with has_aux); `vjp_fn(cotangents)` gives one
    cotangent per primal, with the primals' structure."""
    name = f"vjp({_name(fun)})"
    leaves, in_tree = tree_flatten(primals)
    types = [type_of(x) for x in leaves]
    closed, out_tree = _trace(lambda *xs: fun(*tree_unflatten(in_tree, list(xs))), types, name)
    main_tree, aux_tree = _split_aux(out_tree, has_aux, name)
    lin = Linearized(closed, leaves, [t.dtype.is_float for t in types])
    n_main = main_tree.num_leaves
    out_types = closed.graph.out_types[:n_main]

    def vjp_fn(cotangents: Any) -> tuple:
        ct_leaves, ct_tree = tree_flatten(cotangents)
        if ct_tree != main_tree:
            raise TransformError(f"{name}: the cotangents have the structure {ct_tree}, but the "
                                 f"function's output has the structure {main_tree} {_where()}")
        ct_leaves = [_matching(ct, want, f"the cotangent for {path}", "that output", name)
                     for path, ct, want in zip(leaf_paths(main_tree, "output"), ct_leaves, out_types)]
        in_cts = lin.transpose(ct_leaves + [None] * (len(lin.outs) - n_main))
        return _outputs(in_tree, _instantiate(in_cts, types))

    outs = _outputs(main_tree, lin.outs[:n_main])
    if aux_tree is None:
        return outs, vjp_fn
    return outs, vjp_fn, _outputs(aux_tree, lin.outs[n_main:])


def value_and_grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """`f(*args) -> (value, gradient)` (`((value, aux), gradient)` with has_aux) for a function
    with a floating-point scalar output; the gradient is with respect to `args[argnums]`."""
    return _gradient(fun, argnums, has_aux, with_value=True)


def grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """`f(*args) -> gradient` (`(gradient, aux)` with has_aux) of a floating-point scalar
    function with respect to `args[argnums]` (an int, or a tuple for a tuple of gradients)."""
    return _gradient(fun, argnums, has_aux, with_value=False)


def _gradient(fun: Callable, argnums: int | Sequence[int], has_aux: bool, with_value: bool) -> Callable:
    label = f"{'value_and_grad' if with_value else 'grad'}({_name(fun)})"
    single = isinstance(argnums, numbers.Integral)
    nums = (int(argnums),) if single else tuple(argnums)

    @functools.wraps(fun)
    def differentiated(*args: Any, **kwargs: Any) -> Any:
        leaves, types, in_tree, call = _differentiated_args(fun, nums, args, kwargs, label)
        closed, out_tree = _trace(call, types, label)
        main_tree, aux_tree = _split_aux(out_tree, has_aux, label)
        out = closed.graph.out_types[0] if main_tree.kind == "leaf" else None
        if out is None or out.shape != () or not out.dtype.is_float:
            shown = ", ".join(map(str, closed.graph.out_types[:main_tree.num_leaves])) or "nothing"
            raise GlueTypeError(f"{label} needs a function returning one floating-point scalar "
                                f"(shape ()), but it returned {main_tree} of {shown} {_where()}")
        lin = Linearized(closed, leaves, [True] * len(leaves))
        cts = lin.transpose([out.dtype.numpy.type(1)] + [None] * (len(lin.outs) - 1))
        grads = _outputs(in_tree, _instantiate(cts, types))
        gradient = grads[0] if single else grads
        value = _result(lin.outs[0])
        if has_aux:
            value = (value, _outputs(aux_tree, lin.outs[1:]))
        if with_value:
            return value, gradient
        return (gradient, value[1]) if has_aux else gradient

    return differentiated


def _differentiated_args(fun: Callable, nums: tuple[int, ...], args: tuple, kwargs: dict,
                         label: str) -> tuple[list[Any], list[TensorType], PyTreeDef, Callable[..., Any]]:
    """The leaves of the arguments at `nums` (checked to be floating-point), their types and
    structure, and `fun` as a function of those leaves (the other arguments held fixed)."""
    positions = _argnum_positions(nums, len(args), label)
    leaves, in_tree = tree_flatten(tuple(args[i] for i in positions))
    types = [type_of(x) for x in leaves]
    _check_differentiable(positions, in_tree, types, label)

    def call(*xs: Any) -> Any:
        full = list(args)
        for i, value in zip(positions, tree_unflatten(in_tree, list(xs))):
            full[i] = value
        return fun(*full, **kwargs)

    return leaves, types, in_tree, call


def _argnum_positions(nums: tuple[int, ...], n_args: int, label: str) -> tuple[int, ...]:
    for i in nums:
        if not -n_args <= i < n_args:
            raise TransformError(f"{label}: argnums={i} is out of range for a call with {n_args} "
                                 f"positional argument(s) {_where()}")
    return tuple(i % n_args for i in nums)


def _check_differentiable(positions: Sequence[int], in_tree: PyTreeDef, types: Sequence[TensorType],
                          label: str) -> None:
    paths = [p for i, child in zip(positions, in_tree.children) for p in leaf_paths(child, f"argument {i}")]
    for path, t in zip(paths, types):
        if not t.dtype.is_float:
            raise GlueTypeError(f"{label}: {path} is {t}, but only floating-point inputs can be "
                                f"differentiated (leave it out of argnums) {_where()}")


# --- forward mode ---------------------------------------------------------------------------

def jvp(fun: Callable, primals: Sequence[Any], tangents: Sequence[Any], has_aux: bool = False) -> tuple:
    """`(fun(*primals), tangent_out)` (and `aux` with has_aux): the directional derivative of
    `fun` at `primals` along `tangents` (same structure, shapes and dtypes as `primals`)."""
    name = f"jvp({_name(fun)})"
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TransformError(f"{name}: primals and tangents must be tuples or lists of arguments, "
                             f"got {type(primals).__name__} and {type(tangents).__name__} {_where()}")
    leaves, in_tree = tree_flatten(tuple(primals))
    t_leaves, t_tree = tree_flatten(tuple(tangents))
    if t_tree != in_tree:
        raise TransformError(f"{name}: the tangents have the structure {t_tree}, but the primals "
                             f"have {in_tree} {_where()}")
    types = [type_of(x) for x in leaves]
    t_leaves = [_matching(t, p, f"the tangent for {path}", "the primal", name)
                for path, p, t in zip(leaf_paths(in_tree, "primals"), types, t_leaves)]
    closed, out_tree = _trace(lambda *xs: fun(*tree_unflatten(in_tree, list(xs))), types, name)
    main_tree, aux_tree = _split_aux(out_tree, has_aux, name)
    outs, out_tangents = jvp_graph(closed, leaves, [t if p.dtype.is_float else None
                                                   for t, p in zip(t_leaves, types)])
    n_main = main_tree.num_leaves
    out_tangents = _instantiate(out_tangents[:n_main], closed.graph.out_types[:n_main])
    result = (_outputs(main_tree, outs[:n_main]), _outputs(main_tree, out_tangents))
    return result if aux_tree is None else result + (_outputs(aux_tree, outs[n_main:]),)


# --- batching -------------------------------------------------------------------------------

def vmap(fun: Callable, in_axes: Any = 0, out_axes: Any = 0) -> Callable:
    """`fun` mapped over an axis of its arguments. `in_axes` (an int, None, or a pytree prefix
    of the positional arguments) names each argument's mapped axis, None for arguments shared by
    every example; keyword arguments are mapped along axis 0. `out_axes` places the batch
    axis in the outputs likewise."""
    label = f"vmap({_name(fun)})"

    @functools.wraps(fun)
    def batched(*args: Any, **kwargs: Any) -> Any:
        leaves, tree, axes = _in_axes(args, kwargs, in_axes, label)
        mapped = [i for i, a in enumerate(axes) if a is not None]
        size = _batch_size(tree, leaves, axes, label)

        def call(*xs: Any) -> Any:
            full = list(leaves)
            for i, x in zip(mapped, xs):
                full[i] = x
            call_args, call_kwargs = tree_unflatten(tree, full)
            return fun(*call_args, **call_kwargs)

        example_types = []
        for i in mapped:
            t = type_of(leaves[i])
            example_types.append(TensorType(t.shape[:axes[i]] + t.shape[axes[i] + 1:], t.dtype))
        closed, out_tree = _trace(call, example_types, label)
        outs, dims = batch_graph(closed, [leaves[i] for i in mapped], [axes[i] for i in mapped], size)
        targets = _prefix_axes(out_axes, out_tree, "out_axes", label, "")
        placed = []
        for out, d, to, t, path in zip(outs, dims, targets, closed.graph.out_types,
                                       leaf_paths(out_tree, "output")):
            if to is None and d is not None:
                raise TransformError(f"{label}: out_axes is None for {path}, but it varies along the "
                                     f"mapped axis {_where()}")
            to = _normal_axis(to, t.ndim + 1, f"out_axes for {path} ({t} per example)", label)
            placed.append(out if to is None else move_batch(out, d, to, size))
        return _outputs(out_tree, placed)

    return batched


def _in_axes(args: tuple, kwargs: dict, in_axes: Any, label: str) -> tuple[list[Any], PyTreeDef, list[Any]]:
    """The leaves of (args, kwargs), their structure, and each leaf's mapped axis (or None)."""
    prefix = tuple(in_axes) if isinstance(in_axes, list) else in_axes
    if isinstance(prefix, tuple) and len(prefix) != len(args):
        raise TransformError(f"{label}: in_axes has {len(prefix)} entries but the function was "
                             f"called with {len(args)} positional argument(s) {_where()}")
    leaves, tree = tree_flatten((args, kwargs))
    axes = _prefix_axes(prefix, tree.children[0], "in_axes", label, "") + \
        _prefix_axes(0, tree.children[1], "in_axes", label, "")
    axes = [None if a is None else _normal_axis(a, type_of(x).ndim, f"in_axes for {p} ({type_of(x)})", label)
            for a, x, p in zip(axes, leaves, _arg_paths(tree))]
    return leaves, tree, axes


def _arg_paths(tree: PyTreeDef) -> list[str]:
    return leaf_paths(tree.children[0], "args") + leaf_paths(tree.children[1], "kwargs")


def _prefix_axes(prefix: Any, tree: PyTreeDef, what: str, label: str, path: str) -> list[Any]:
    """One axis per leaf of `tree`, from `prefix`: an axis (int or None) for a whole subtree,
    or a tuple/list/dict that matches the tree's structure down to where axes are given."""
    if prefix is None or (isinstance(prefix, numbers.Integral) and not isinstance(prefix, bool)):
        return [prefix] * tree.num_leaves
    if isinstance(prefix, (tuple, list)) and tree.kind in ("tuple", "list", "namedtuple") \
            and len(prefix) == len(tree.children):
        return [a for k, (p, c) in enumerate(zip(prefix, tree.children))
                for a in _prefix_axes(p, c, what, label, f"{path}[{k}]")]
    if isinstance(prefix, dict) and tree.kind == "dict" and tuple(sorted(prefix)) == tree.keys:
        return [a for k, c in zip(tree.keys, tree.children)
                for a in _prefix_axes(prefix[k], c, what, label, f"{path}[{k!r}]")]
    shown = "an array" if tree.kind == "leaf" else f"the structure {tree}"
    raise TransformError(f"{label}: {what}{path} = {prefix!r} does not match {shown} "
                         f"of the value it describes {_where()}")


def _normal_axis(axis: int | None, ndim: int, what: str, label: str) -> int | None:
    if axis is None:
        return None
    if not -ndim <= axis < ndim:
        raise TransformError(f"{label}: {what} is axis {axis}, out of range for rank {ndim} {_where()}")
    return int(axis) % ndim


def _batch_size(tree: PyTreeDef, leaves: Sequence[Any], axes: Sequence[int | None], label: str) -> int:
    mapped = [(p, type_of(x), a) for p, x, a in zip(_arg_paths(tree), leaves, axes) if a is not None]
    if not mapped:
        raise TransformError(f"{label}: in_axes maps no argument; at least one must be mapped "
                             f"(not None) {_where()}")
    sizes = {t.shape[a] for _, t, a in mapped}
    if len(sizes) > 1:
        shown = "; ".join(f"{p} ({t}) axis {a} has size {t.shape[a]}" for p, t, a in mapped)
        raise TransformError(f"{label}: the mapped axes have different sizes: {shown} {_where()}")
    return sizes.pop()


# --- Jacobians ------------------------------------------------------------------------------

def _sizes(types: Sequence[TensorType]) -> list[int]:
    return [t.size for t in types]


def _basis(types: Sequence[TensorType]) -> list[np.ndarray]:
    """The rows of the identity over all of `types`' elements, cut into one array per type:
    array k holds, for each row, that row's part shaped like type k."""
    total = sum(_sizes(types))
    eye = np.eye(total)
    parts, start = [], 0
    for t in types:
        parts.append(eye[:, start:start + t.size].reshape((total,) + t.shape).astype(t.dtype.numpy))
        start += t.size
    return parts


def _cut_axis(x: Any, axis: int, start: int, stop: int) -> Any:
    shape = type_of(x).shape
    return emit("slice", x, start=tuple(start if i == axis else 0 for i in range(len(shape))),
                limit=tuple(stop if i == axis else n for i, n in enumerate(shape)), strides=(1,) * len(shape))


def _by_input(x: Any, axis: int, types: Sequence[TensorType], tree: PyTreeDef, single: bool) -> Any:
    """`x`, whose axis `axis` runs over every input element, as a pytree of the inputs' structure
    with that axis replaced by each input's shape."""
    shape = type_of(x).shape
    pieces, start = [], 0
    for t in types:
        piece = _cut_axis(x, axis, start, start + t.size)
        pieces.append(emit("reshape", piece, shape=shape[:axis] + t.shape + shape[axis + 1:]))
        start += t.size
    grouped = tree_unflatten(tree, pieces)
    return grouped[0] if single else grouped


def _jacobian_args(fun: Callable, argnums: int | Sequence[int], args: tuple, kwargs: dict, label: str):
    """(leaves, their types, structure, function of the leaves, single) for a Jacobian."""
    single = isinstance(argnums, numbers.Integral)
    nums = (int(argnums),) if single else tuple(argnums)
    return _differentiated_args(fun, nums, args, kwargs, label) + (single,)


def jacfwd(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of `fun` by forward mode (jax.jacfwd): one jvp per input element, batched
    with vmap. Each output leaf gets the shape output + input (a pytree of the inputs'
    structure when `argnums` is a tuple)."""
    label = f"jacfwd({_name(fun)})"

    @functools.wraps(fun)
    def jacobian(*args: Any, **kwargs: Any) -> Any:
        leaves, types, in_tree, call, single = _jacobian_args(fun, argnums, args, kwargs, label)

        def push(*tangents: Any) -> Any:
            result = jvp(call, leaves, list(tangents), has_aux=has_aux)
            return (result[1], result[2]) if has_aux else result[1]

        out = vmap(push, out_axes=(-1, None) if has_aux else -1)(*_basis(types))
        jac, aux = out if has_aux else (out, None)
        jac_leaves, out_tree = tree_flatten(jac)
        jac = tree_unflatten(out_tree, [_by_input(j, type_of(j).ndim - 1, types, in_tree, single)
                                        for j in jac_leaves])
        return (jac, aux) if has_aux else jac

    return jacobian


def jacrev(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of `fun` by reverse mode (jax.jacrev): one vjp per output element, batched
    with vmap; the same layout as jacfwd's."""
    label = f"jacrev({_name(fun)})"

    @functools.wraps(fun)
    def jacobian(*args: Any, **kwargs: Any) -> Any:
        leaves, types, in_tree, call, single = _jacobian_args(fun, argnums, args, kwargs, label)
        result = vjp(call, *leaves, has_aux=has_aux)
        out, pullback = result[0], result[1]
        out_leaves, out_tree = tree_flatten(out)
        out_types = [type_of(o) for o in out_leaves]

        def pull(*cts: Any) -> Any:
            return pullback(tree_unflatten(out_tree, list(cts)))

        rows = vmap(pull)(*_basis(out_types))  # per input leaf: (output elements,) + its shape
        jac, start = [], 0
        for t in out_types:
            pieces = [emit("reshape", _cut_axis(r, 0, start, start + t.size), shape=t.shape + type_of(r).shape[1:])
                      for r in rows]
            grouped = tree_unflatten(in_tree, pieces)
            jac.append(grouped[0] if single else grouped)
            start += t.size
        jac = tree_unflatten(out_tree, jac)
        return (jac, result[2]) if has_aux else jac

    return jacobian


def hessian(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Hessian of a scalar function (jax.hessian): jacfwd of jacrev."""
    return jacfwd(jacrev(fun, argnums, has_aux=has_aux), argnums, has_aux=has_aux)
