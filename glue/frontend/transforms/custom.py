"""JAX's custom derivatives and rematerialisation: `custom_jvp`, `custom_vjp`, `checkpoint`
(`remat`) and `checkpoint_policies`.

Each call traces the user's functions into body graphs and binds one equation holding them
(custom_jvp_call, custom_vjp_call, checkpoint); the transforms' rules (`calls.py`) give them
their meaning under jvp, grad and vmap, and jit inlines their bodies before it compiles, so
they cost nothing where nothing differentiates them. Arguments named in `nondiff_argnums` (or
`static_argnums` for checkpoint) are Python values baked into the traces, passed to the rules
first, as in JAX. The functions may close over other values (of an enclosing jit, say), which
then get no derivative; custom_jvp and custom_vjp functions cannot print.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Iterator, Sequence

from glue.errors import GlueError, GlueTypeError, describe_location, user_frame_location
from glue.frontend.bodies import Body, trace_body, token_operands
from glue.frontend.pytree import PyTreeDef, tree_flatten, tree_unflatten
from glue.frontend.tracing import bind, type_of
from glue.frontend.transforms.calls import POLICIES
from glue.frontend.transforms.core import zeros
from glue.ir import TensorType, Var
from glue.ir.primitives import CHECKPOINT_POLICIES


class _InRules(threading.local):
    """The custom-derivative functions whose rules are being traced in this thread. A rule that
    calls its own function (`ans = f(x)` in f's jvp rule, `f(x)` in its fwd) gets the plain
    function there: the rule is what defines the derivative, and tracing it again would never
    end."""

    def __init__(self) -> None:
        self.active: set[int] = set()


_IN_RULES = _InRules()


@contextlib.contextmanager
def _tracing_rules(fn: Any) -> Iterator[None]:
    _IN_RULES.active.add(id(fn))
    try:
        yield
    finally:
        _IN_RULES.active.discard(id(fn))


def _where() -> str:
    return describe_location(user_frame_location())


def _name(fun: Callable) -> str:
    return getattr(fun, "__name__", type(fun).__name__)


def _positional(fun: Callable, args: tuple, kwargs: dict) -> tuple:
    """The call's arguments, keywords resolved into positions by `fun`'s signature."""
    if not kwargs:
        return args
    try:
        bound = inspect.signature(fun).bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise GlueTypeError(f"{_name(fun)}: {exc} {_where()}") from None
    return bound.args


class _Split:
    """A call's arguments split into the differentiated ones (a flat list of leaves) and the
    `nondiff` ones (Python values, by position)."""

    def __init__(self, args: tuple, nondiff: Sequence[int], name: str):
        for i in nondiff:
            if not -len(args) <= i < len(args):
                raise GlueTypeError(f"{name}: nondiff_argnums names argument {i}, but it was called with "
                                    f"{len(args)} {_where()}")
        self.fixed = {i % len(args): args[i] for i in nondiff}
        self.n = len(args)
        self.leaves, self.tree = tree_flatten(tuple(a for i, a in enumerate(args) if i not in self.fixed))
        self.types = [type_of(x) for x in self.leaves]

    def args(self, leaves: Sequence[Any]) -> list[Any]:
        """The full argument list with `leaves` for the differentiated arguments."""
        diff = iter(tree_unflatten(self.tree, list(leaves)))
        return [self.fixed[i] if i in self.fixed else next(diff) for i in range(self.n)]

    def diff(self, leaves: Sequence[Any]) -> tuple:
        return tree_unflatten(self.tree, list(leaves))

    def nondiff(self) -> list[Any]:
        return [self.fixed[i] for i in sorted(self.fixed)]


def _traced(fn: Callable[..., Any], types: Sequence[TensorType], name: str, trees: list[PyTreeDef]) -> Body:
    def flat(*leaves: Any) -> list[Any]:
        out, tree = tree_flatten(fn(*leaves))
        trees.append(tree)
        return out
    return trace_body(flat, types, name, token=False)


def _inputs(body: Body, n_args: int, others: Sequence[Body], mine: int) -> list[Var]:
    """A body's inputs for an equation whose operands are the arguments then every body's
    constants (unused inputs for the others')."""
    consts = [list(b.const_vars) if k == mine else [Var(v.type) for v in b.const_vars]
              for k, b in enumerate(others)]
    return list(body.arg_vars[:n_args]) + [v for vs in consts for v in vs]


def _check_like(name: str, what: str, got_tree: PyTreeDef, got: Sequence[TensorType], want_tree: PyTreeDef,
                want: Sequence[TensorType]) -> None:
    if got_tree != want_tree:
        raise GlueTypeError(f"{name}: {what} has the structure {got_tree}, but the function's output has "
                            f"{want_tree} {_where()}")
    for k, (g, w) in enumerate(zip(got, want)):
        if g != w:
            raise GlueTypeError(f"{name}: leaf {k} of {what} is {g}, but the function's output is {w} {_where()}")


# --- custom_jvp -----------------------------------------------------------------------------

class custom_jvp:  # noqa: N801 (JAX's name)
    """A function with a forward-mode derivative of its own (jax.custom_jvp):

        @glue.custom_jvp
        def f(x): ...
        @f.defjvp
        def f_jvp(primals, tangents):
            (x,), (t,) = primals, tangents
            return f(x), <tangent of f at x along t>

    The rule must be linear in the tangents; reverse mode transposes it."""

    def __init__(self, fun: Callable, nondiff_argnums: Sequence[int] = ()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.jvp: Callable | None = None

    def defjvp(self, jvp: Callable, symbolic_zeros: bool = False) -> Callable:
        """Set the rule `jvp(*nondiff_args, primals, tangents) -> (primal_out, tangent_out)`."""
        if symbolic_zeros:
            raise GlueError(f"custom_jvp {_name(self.fun)}: symbolic_zeros=True is not supported; every "
                            f"tangent is an array (of zeros where none flows) {_where()}")
        self.jvp = jvp
        return jvp

    def defjvps(self, *jvps: Callable | None) -> None:
        """Set one rule per argument, `jvp_i(tangent_i, primal_out, *primals) -> its part of the
        output tangent` (None: the output does not depend on it); the parts are summed."""
        fun = self.fun

        def rule(primals: tuple, tangents: tuple) -> tuple:
            out = fun(*primals)
            parts = [jvp(t, out, *primals) for jvp, t in zip(jvps, tangents) if jvp is not None]
            total = functools.reduce(lambda a, b: _tree_add(a, b), parts) if parts else _tree_zeros(out)
            return out, total

        self.jvp = rule

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = f"custom_jvp {_name(self.fun)}"
        if id(self) in _IN_RULES.active:
            return self.fun(*args, **kwargs)
        if self.jvp is None:
            raise GlueError(f"{name} has no rule: define one with @{_name(self.fun)}.defjvp {_where()}")
        split = _Split(_positional(self.fun, args, kwargs), self.nondiff_argnums, name)
        n = len(split.leaves)
        out_trees: list[PyTreeDef] = []
        body = _traced(lambda *xs: self.fun(*split.args(xs)), split.types, name, out_trees)
        jvp_trees: list[PyTreeDef] = []

        def rule(*leaves: Any) -> Any:
            primals, tangents = split.diff(leaves[:n]), split.diff(leaves[n:])
            result = self.jvp(*split.nondiff(), primals, tangents)
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise GlueTypeError(f"{name}: the jvp rule must return a pair (primal_out, tangent_out) {_where()}")
            return tuple(result)

        with _tracing_rules(self):
            jvp = _traced(rule, split.types + split.types, f"the jvp rule of {name}", jvp_trees)
        out_tree = out_trees[0]
        n_out = out_tree.num_leaves
        pair = jvp_trees[0]
        _check_like(name, "the rule's primal output", pair.children[0], jvp.out_types[:n_out], out_tree,
                    body.out_types)
        _check_like(name, "the rule's tangent output", pair.children[1], jvp.out_types[n_out:], out_tree,
                    body.out_types)
        bodies = [body, jvp]
        body_graph = body.with_invars(_inputs(body, n, bodies, 0))
        jvp_graph = jvp.with_invars(_inputs(jvp, n, bodies, 1) + list(jvp.arg_vars[n:]))
        outs = bind("custom_jvp_call", *split.leaves, *body.consts, *jvp.consts, body=body_graph, jvp=jvp_graph,
                    num_consts=body.n_consts + jvp.n_consts)
        return tree_unflatten(out_tree, outs)


def _tree_add(a: Any, b: Any) -> Any:
    la, tree = tree_flatten(a)
    lb, _ = tree_flatten(b)
    return tree_unflatten(tree, [bind("add", x, y) for x, y in zip(la, lb)])


def _tree_zeros(x: Any) -> Any:
    leaves, tree = tree_flatten(x)
    return tree_unflatten(tree, [zeros(type_of(v)) for v in leaves])


# --- custom_vjp -----------------------------------------------------------------------------

class custom_vjp:  # noqa: N801 (JAX's name)
    """A function with a reverse-mode derivative of its own (jax.custom_vjp):

        @glue.custom_vjp
        def f(x): ...
        def f_fwd(x): return f(x), residuals
        def f_bwd(residuals, g): return (cotangent of x,)
        f.defvjp(f_fwd, f_bwd)

    bwd returns one cotangent per (differentiated) argument, in a tuple; None stands for
    zeros. It cannot be differentiated in forward mode, as in JAX."""

    def __init__(self, fun: Callable, nondiff_argnums: Sequence[int] = ()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.fwd: Callable | None = None
        self.bwd: Callable | None = None

    def defvjp(self, fwd: Callable, bwd: Callable, symbolic_zeros: bool = False) -> None:
        """Set `fwd(*args) -> (out, residuals)` and `bwd(*nondiff_args, residuals, g) -> cotangents`."""
        if symbolic_zeros:
            raise GlueError(f"custom_vjp {_name(self.fun)}: symbolic_zeros=True is not supported {_where()}")
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = f"custom_vjp {_name(self.fun)}"
        if id(self) in _IN_RULES.active:
            return self.fun(*args, **kwargs)
        if self.fwd is None:
            raise GlueError(f"{name} has no rule: define one with {_name(self.fun)}.defvjp(fwd, bwd) {_where()}")
        split = _Split(_positional(self.fun, args, kwargs), self.nondiff_argnums, name)
        n = len(split.leaves)
        out_trees: list[PyTreeDef] = []
        body = _traced(lambda *xs: self.fun(*split.args(xs)), split.types, name, out_trees)
        out_tree = out_trees[0]
        n_out = out_tree.num_leaves

        def forward(*leaves: Any) -> Any:
            result = self.fwd(*split.args(leaves))
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise GlueTypeError(f"{name}: fwd must return a pair (output, residuals) {_where()}")
            return tuple(result)

        fwd_trees: list[PyTreeDef] = []
        with _tracing_rules(self):
            fwd = _traced(forward, split.types, f"the fwd of {name}", fwd_trees)
        _check_like(name, "fwd's output", fwd_trees[0].children[0], fwd.out_types[:n_out], out_tree, body.out_types)
        res_tree = fwd_trees[0].children[1]
        res_types = list(fwd.out_types[n_out:])

        def backward(*leaves: Any) -> list[Any]:
            residuals = tree_unflatten(res_tree, list(leaves[:len(res_types)]))
            cts = tree_unflatten(out_tree, list(leaves[len(res_types):]))
            grads = self.bwd(*split.nondiff(), residuals, cts)
            return _cotangents(name, grads, split)

        with _tracing_rules(self):
            bwd = trace_body(backward, res_types + list(body.out_types), f"the bwd of {name}", token=False)
        # each graph takes its own constants after its inputs: the operands hold all three sets
        outs = bind("custom_vjp_call", *split.leaves, *body.consts, *fwd.consts, *bwd.consts, body=body.graph,
                    fwd=fwd.graph, bwd=bwd.graph, num_consts=(body.n_consts, fwd.n_consts, bwd.n_consts))
        return tree_unflatten(out_tree, outs)


def _cotangents(name: str, grads: Any, split: _Split) -> list[Any]:
    """bwd's result as one cotangent leaf per differentiated argument leaf (None: zeros)."""
    n_diff = len(split.tree.children)
    if not isinstance(grads, (tuple, list)) or len(grads) != n_diff:
        raise GlueTypeError(f"{name}: bwd must return a tuple with one cotangent per differentiated "
                            f"argument ({n_diff}), not {type(grads).__name__} {_where()}")
    leaves = []
    for k, (g, arg_tree) in enumerate(zip(grads, split.tree.children)):
        start = sum(c.num_leaves for c in split.tree.children[:k])
        types = split.types[start:start + arg_tree.num_leaves]
        if g is None:
            leaves += [zeros(t) for t in types]
            continue
        got, tree = tree_flatten(g)
        if tree != arg_tree:
            raise GlueTypeError(f"{name}: bwd's cotangent {k} has the structure {tree}, but the argument has "
                                f"{arg_tree} {_where()}")
        for x, t in zip(got, types):
            if type_of(x).shape != t.shape:
                raise GlueTypeError(f"{name}: bwd's cotangent {k} is {type_of(x)}, but the argument is {t} {_where()}")
            leaves.append(bind("convert_element_type", x, new_dtype=t.dtype) if type_of(x).dtype != t.dtype else x)
    return leaves


# --- checkpoint -----------------------------------------------------------------------------

class checkpoint_policies:  # noqa: N801 (JAX's name: a namespace of policies)
    """What `checkpoint` keeps from the forward pass for the backward (the rest is recomputed):
    nothing, everything, the results of contractions, or those of contractions without batch
    dimensions. Each is a JAX-style predicate `policy(primitive, *avals, **params)`."""

    nothing_saveable = staticmethod(POLICIES["nothing_saveable"])
    everything_saveable = staticmethod(POLICIES["everything_saveable"])
    dots_saveable = staticmethod(POLICIES["dots_saveable"])
    checkpoint_dots = dots_saveable
    dots_with_no_batch_dims_saveable = staticmethod(POLICIES["dots_with_no_batch_dims_saveable"])
    checkpoint_dots_with_no_batch_dims = dots_with_no_batch_dims_saveable


def checkpoint(fun: Callable | None = None, *, prevent_cse: bool = True, policy: Callable | None = None,
               static_argnums: int | Sequence[int] = ()) -> Callable:
    """`fun`, whose reverse-mode derivative recomputes its forward pass inside the backward
    instead of keeping its intermediate values (jax.checkpoint / jax.remat): less memory for
    more compute. `policy` (from `glue.checkpoint_policies`) names values to keep anyway.
    Without differentiation it is just `fun`."""
    if fun is None:
        return functools.partial(checkpoint, prevent_cse=prevent_cse, policy=policy, static_argnums=static_argnums)
    chosen = "nothing_saveable" if policy is None else next((n for n, p in POLICIES.items() if p is policy), None)
    if chosen is None:
        raise GlueError(f"checkpoint: policy {policy!r} is not one of glue.checkpoint_policies "
                        f"({', '.join(CHECKPOINT_POLICIES)}) {_where()}")
    statics = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    name = f"checkpoint {_name(fun)}"

    @functools.wraps(fun)
    def remat(*args: Any, **kwargs: Any) -> Any:
        split = _Split(_positional(fun, args, kwargs), statics, name)
        out_trees: list[PyTreeDef] = []

        def flat(*leaves: Any) -> list[Any]:
            out, tree = tree_flatten(fun(*split.args(leaves)))
            out_trees.append(tree)
            return out

        body = trace_body(flat, split.types, name)
        outs = bind("checkpoint", *token_operands(body.effects), *split.leaves, *body.consts, body=body.graph,
                    policy=chosen, prevent_cse=bool(prevent_cse))
        return tree_unflatten(out_trees[0], outs[int(body.effects):])

    return remat


remat = checkpoint


__all__ = ["checkpoint", "checkpoint_policies", "custom_jvp", "custom_vjp", "remat"]
