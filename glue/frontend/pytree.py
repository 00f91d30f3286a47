"""Pytrees: nested tuples, lists, dicts, namedtuples, OrderedDicts and None around array leaves,
flattened and rebuilt."""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from glue.errors import GlueError, describe_location, user_frame_location


@dataclass(frozen=True)
class PyTreeDef:
    """The structure of a pytree without its leaves; hashable, so it can key a cache."""

    kind: str  # leaf | none | tuple | list | dict | namedtuple (keys: its class) | odict
    children: tuple["PyTreeDef", ...] = ()
    keys: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.kind, self.children, self.keys)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def num_leaves(self) -> int:
        return 1 if self.kind == "leaf" else sum(c.num_leaves for c in self.children)

    def __str__(self) -> str:
        if self.kind in ("leaf", "none"):
            return "*" if self.kind == "leaf" else "None"
        if self.kind in ("dict", "odict"):
            items = "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(self.keys, self.children)) + "}"
            return items if self.kind == "dict" else f"OrderedDict({items})"
        inner = ", ".join(map(str, self.children))
        if self.kind == "namedtuple":
            return f"{self.keys[0].__name__}({inner})"
        return f"({inner},)" if self.kind == "tuple" and len(self.children) == 1 else \
            (f"({inner})" if self.kind == "tuple" else f"[{inner}]")


LEAF = PyTreeDef("leaf")


def _dict_children(tree: dict) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    try:
        keys = tuple(sorted(tree))
    except TypeError:  # keys of types that do not compare (str with int), as in JAX an error
        kinds = sorted({type(k).__name__ for k in tree})
        raise GlueError(f"a dict in a pytree needs keys that sort (its leaves are ordered by key), but "
                        f"its keys {list(tree)[:8]} mix {' and '.join(kinds)}; use keys of one type "
                        f"{describe_location(user_frame_location())}") from None
    return "dict", tuple(tree[k] for k in keys), keys


# Node types by exact type. A namedtuple class or OrderedDict (whose keys keep their order) is
# added on first sight by `_node_split`; any other type, subclasses of the above included, is a
# leaf.
_NODES: dict[type, Callable[[Any], tuple[str, tuple[Any, ...], tuple[Any, ...]]]] = {
    type(None): lambda tree: ("none", (), ()),
    tuple: lambda tree: ("tuple", tree, ()),
    list: lambda tree: ("list", tuple(tree), ()),
    dict: _dict_children,
}
_LEAF_TYPES: set[type] = set()


def _node_split(cls: type) -> Callable[[Any], tuple[str, tuple[Any, ...], tuple[Any, ...]]] | None:
    """How to split an instance of `cls` into its children, or None for a leaf type."""
    split = _NODES.get(cls)
    if split is None and cls not in _LEAF_TYPES:
        if issubclass(cls, tuple) and hasattr(cls, "_fields"):
            split = _NODES[cls] = lambda tree: ("namedtuple", tuple(tree), (cls,))
        elif issubclass(cls, OrderedDict):
            split = _NODES[cls] = lambda tree: ("odict", tuple(tree.values()), tuple(tree))
        else:
            _LEAF_TYPES.add(cls)
    return split


def tree_flatten(tree: Any) -> tuple[list[Any], PyTreeDef]:
    """The leaves of `tree` (left to right, dict keys sorted) and its structure."""
    leaves: list[Any] = []
    try:
        return leaves, _walk(tree, leaves)
    except RecursionError:
        raise GlueError(f"a pytree nested deeper than Python's recursion limit ({sys.getrecursionlimit()} "
                        f"frames) {describe_location(user_frame_location())}") from None


# Structures seen so far, keyed by kind, the ids of the (interned) children and the dict keys,
# so that flattening the same shape of tree again (every call of a jitted function) builds no
# new PyTreeDef and hashes only ints and strings.
_INTERNED: dict[tuple[str, tuple[int, ...], tuple[Any, ...]], PyTreeDef] = {}


def _walk(node: Any, leaves: list[Any]) -> PyTreeDef:
    split = _node_split(node.__class__)
    if split is None:
        leaves.append(node)
        return LEAF
    kind, kids, keys = split(node)
    defs = []
    for kid in kids:
        if kid.__class__ not in _LEAF_TYPES and _node_split(kid.__class__) is not None:
            defs.append(_walk(kid, leaves))
        else:  # a leaf, inline: most children are
            leaves.append(kid)
            defs.append(LEAF)
    key = (kind, tuple(map(id, defs)), keys)
    treedef = _INTERNED.get(key)
    if treedef is None:
        treedef = _INTERNED[key] = PyTreeDef(kind, tuple(defs), keys)
    return treedef


_CALLS: dict[tuple[Any, ...], PyTreeDef] = {}


def flatten_call(args: tuple[Any, ...]) -> tuple[list[Any], PyTreeDef]:
    """`tree_flatten((args, {}))`: a call's positional arguments and no keywords, without a walk
    when each argument is a leaf or a flat list or tuple of leaves of types already seen (most
    calls)."""
    leaves: list[Any] = []
    shape = []
    for a in args:
        cls = a.__class__
        if cls in _LEAF_TYPES:
            leaves.append(a)
            shape.append(None)
        elif (cls is list or cls is tuple) and all(map(_LEAF_TYPES.__contains__, map(type, a))):
            leaves.extend(a)
            shape.append((cls, len(a)))
        else:
            return tree_flatten((args, {}))
    key = tuple(shape)
    treedef = _CALLS.get(key)
    if treedef is None:
        treedef = _CALLS[key] = tree_flatten((args, {}))[1]
    return leaves, treedef


def tree_unflatten(treedef: PyTreeDef, leaves: list[Any]) -> Any:
    """The pytree of structure `treedef` holding `leaves`."""
    return _build(treedef, iter(leaves))


def _build(node: PyTreeDef, it: Any) -> Any:
    # A module-level function rather than a recursive closure: a closure that calls itself is
    # a reference cycle, which kept the leaves (large output arrays) alive until the next
    # garbage collection.
    if node.kind == "leaf":
        return next(it)
    return _BUILD[node.kind](node, [next(it) if c is LEAF else _build(c, it) for c in node.children])


_BUILD: dict[str, Callable[[PyTreeDef, list[Any]], Any]] = {
    "none": lambda node, kids: None,
    "tuple": lambda node, kids: tuple(kids),
    "list": lambda node, kids: kids,
    "dict": lambda node, kids: dict(zip(node.keys, kids)),
    "namedtuple": lambda node, kids: node.keys[0](*kids),
    "odict": lambda node, kids: OrderedDict(zip(node.keys, kids)),
}


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    leaves, treedef = tree_flatten(tree)
    others = [tree_flatten(r)[0] for r in rest]
    return tree_unflatten(treedef, [fn(*xs) for xs in zip(leaves, *others)])


def leaf_paths(treedef: PyTreeDef, prefix: str = "") -> list[str]:
    """A readable path (`[0]['w']`, `.w` for a namedtuple field) for each leaf, in flattening
    order."""
    if treedef.kind == "leaf":
        return [prefix]
    if treedef.kind == "namedtuple":
        steps = [f".{name}" for name in treedef.keys[0]._fields]
    else:
        keys = treedef.keys if treedef.kind in ("dict", "odict") else range(len(treedef.children))
        steps = [f"[{k!r}]" for k in keys]
    return [p for step, c in zip(steps, treedef.children) for p in leaf_paths(c, prefix + step)]
