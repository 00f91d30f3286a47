"""Pytrees: nested tuples, lists, dicts, namedtuples, OrderedDicts, defaultdicts, None and
registered node types around array leaves, flattened and rebuilt (JAX's semantics).

A registered type (`register_node`) is split by its own flatten function into children and
hashable aux data, which is part of the structure: two instances with different aux data have
different structures (and a jitted function retraces). Any other type is a leaf, subclasses of
the built-in node types included; `is_leaf` makes chosen subtrees leaves.
"""
from __future__ import annotations

import sys
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Any, Callable, Hashable, Iterable, Sequence

from glue.errors import GlueError, describe_location, user_frame_location

IsLeaf = Callable[[Any], bool] | None


class TreeStructureError(GlueError, ValueError):
    """A pytree does not have the structure it must have (tree_map's other trees, unflatten's
    leaves, a registration)."""


@dataclass(frozen=True)
class PyTreeDef:
    """The structure of a pytree without its leaves; hashable, so it can key a cache."""

    kind: str  # leaf | none | tuple | list | dict | namedtuple | odict | defaultdict | custom
    children: tuple["PyTreeDef", ...] = ()
    # dict keys (sorted); odict keys (in order); (class,) of a namedtuple; (default_factory,
    # keys) of a defaultdict; (class, aux data) of a registered node
    keys: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.kind, self.children, self.keys)))
        leaves = 1 if self.kind == "leaf" else sum(c.num_leaves for c in self.children)
        object.__setattr__(self, "_num_leaves", leaves)

    def __hash__(self) -> int:
        return self._hash

    @property
    def num_leaves(self) -> int:
        return self._num_leaves

    @property
    def num_nodes(self) -> int:
        return 1 + sum(c.num_nodes for c in self.children)

    def unflatten(self, leaves: Iterable[Any]) -> Any:
        return tree_unflatten(self, leaves)

    def flatten_up_to(self, tree: Any) -> list[Any]:
        """The subtrees of `tree` where this structure has its leaves; `tree` must have this
        structure down to there (a TreeStructureError names the first place it does not)."""
        return flatten_up_to(self, tree, f"flatten_up_to: the tree does not have the structure {self}")

    def __str__(self) -> str:
        if self.kind in ("leaf", "none"):
            return "*" if self.kind == "leaf" else "None"
        if self.kind in ("dict", "odict", "defaultdict"):
            keys = self.keys[1] if self.kind == "defaultdict" else self.keys
            items = "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(keys, self.children)) + "}"
            if self.kind == "defaultdict":
                return f"defaultdict({self.keys[0]!r}, {items})"
            return items if self.kind == "dict" else f"OrderedDict({items})"
        inner = ", ".join(map(str, self.children))
        if self.kind == "namedtuple":
            return f"{self.keys[0].__name__}({inner})"
        if self.kind == "custom":
            return f"CustomNode({self.keys[0].__name__}[{self.keys[1]!r}], [{inner}])"
        return f"({inner},)" if self.kind == "tuple" and len(self.children) == 1 else \
            (f"({inner})" if self.kind == "tuple" else f"[{inner}]")


LEAF = PyTreeDef("leaf")

Split = Callable[[Any], tuple[str, tuple[Any, ...], tuple[Any, ...]]]


def _dict_children(tree: dict) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    try:
        keys = tuple(sorted(tree))
    except TypeError:  # keys of types that do not compare (str with int), as in JAX an error
        kinds = sorted({type(k).__name__ for k in tree})
        raise GlueError(f"a dict in a pytree needs keys that sort (its leaves are ordered by key), but "
                        f"its keys {list(tree)[:8]} mix {' and '.join(kinds)}; use keys of one type "
                        f"{describe_location(user_frame_location())}") from None
    return "dict", tuple(tree[k] for k in keys), keys


def _defaultdict_children(tree: defaultdict) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    keys = tuple(sorted(tree))
    return "defaultdict", tuple(tree[k] for k in keys), (tree.default_factory, keys)


@dataclass(frozen=True)
class Registration:
    """How a registered node type splits and rebuilds: flatten(x) -> (children, aux data),
    unflatten(aux data, children) -> x; `names` name the children in leaf paths."""

    flatten: Callable[[Any], tuple[Iterable[Any], Hashable]]
    unflatten: Callable[[Hashable, Iterable[Any]], Any]
    names: tuple[str, ...] | None = None


_REGISTERED: dict[type, Registration] = {}

# Node types by exact type. A namedtuple class or OrderedDict (whose keys keep their order) is
# added on first sight by `_node_split`; registered types by `register_node`; any other type,
# subclasses of the above included, is a leaf.
_NODES: dict[type, Split] = {
    type(None): lambda tree: ("none", (), ()),
    tuple: lambda tree: ("tuple", tree, ()),
    list: lambda tree: ("list", tuple(tree), ()),
    dict: _dict_children,
    defaultdict: _defaultdict_children,
}
_LEAF_TYPES: set[type] = set()


def _node_split(cls: type) -> Split | None:
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


def _where() -> str:
    return describe_location(user_frame_location())


def register_node(cls: type, flatten: Callable[[Any], tuple[Iterable[Any], Hashable]],
                  unflatten: Callable[[Hashable, Iterable[Any]], Any],
                  names: Sequence[str] | None = None) -> None:
    """Make `cls` a pytree node type (see `Registration`)."""
    if cls in _REGISTERED or cls in (type(None), tuple, list, dict, defaultdict):
        raise TreeStructureError(f"{cls.__name__} is already a pytree node type {_where()}")
    registration = _REGISTERED[cls] = Registration(flatten, unflatten, None if names is None else tuple(names))

    def split(tree: Any) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
        children, aux = registration.flatten(tree)
        try:
            hash(aux)
        except TypeError:
            raise TreeStructureError(f"the flatten function of {cls.__name__} returned aux data "
                                     f"{aux!r}, which is not hashable {_where()}") from None
        return "custom", tuple(children), (cls, aux)

    _NODES[cls] = split
    _LEAF_TYPES.discard(cls)  # if it was seen as a leaf before it was registered


def tree_flatten(tree: Any, is_leaf: IsLeaf = None) -> tuple[list[Any], PyTreeDef]:
    """The leaves of `tree` (left to right, dict keys sorted) and its structure; a subtree for
    which `is_leaf` is true is a leaf."""
    leaves: list[Any] = []
    try:
        return leaves, _walk(tree, leaves, is_leaf)
    except RecursionError:
        raise GlueError(f"a pytree nested deeper than Python's recursion limit ({sys.getrecursionlimit()} "
                        f"frames) {describe_location(user_frame_location())}") from None


def tree_leaves(tree: Any, is_leaf: IsLeaf = None) -> list[Any]:
    return tree_flatten(tree, is_leaf)[0]


def tree_structure(tree: Any, is_leaf: IsLeaf = None) -> PyTreeDef:
    return tree_flatten(tree, is_leaf)[1]


# Structures seen so far, keyed by kind, the ids of the (interned) children and the keys, so
# that flattening the same shape of tree again (every call of a jitted function) builds no new
# PyTreeDef and hashes only ints, strings and aux data.
_INTERNED: dict[tuple[str, tuple[int, ...], tuple[Any, ...]], PyTreeDef] = {}


def _walk(node: Any, leaves: list[Any], is_leaf: IsLeaf) -> PyTreeDef:
    split = None if is_leaf is not None and is_leaf(node) else _node_split(node.__class__)
    if split is None:
        leaves.append(node)
        return LEAF
    kind, kids, keys = split(node)
    defs = []
    for kid in kids:
        if is_leaf is None and (kid.__class__ in _LEAF_TYPES or _node_split(kid.__class__) is None):
            leaves.append(kid)  # a leaf, inline: most children are
            defs.append(LEAF)
        else:
            defs.append(_walk(kid, leaves, is_leaf))
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


def tree_unflatten(treedef: PyTreeDef, leaves: Iterable[Any]) -> Any:
    """The pytree of structure `treedef` holding `leaves` (exactly as many as it has)."""
    leaves = leaves if isinstance(leaves, (list, tuple)) else list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise TreeStructureError(f"tree_unflatten: the structure {treedef} has {treedef.num_leaves} "
                                 f"leaves, but {len(leaves)} were given {_where()}")
    return _build(treedef, iter(leaves))


def unflattener(treedef: PyTreeDef) -> Callable[[Sequence[Any]], Any]:
    """`tree_unflatten(treedef, ·)`, made once for many calls (a jitted function's outputs): a
    leaf is the list's item, and a tuple whose children are leaves and lists of leaves (a
    training step's params, state and loss) one `itemgetter` of items and slices, which runs
    no bytecode per leaf."""
    if treedef.kind == "leaf":
        return itemgetter(0)
    kids = treedef.children
    if treedef.kind == "tuple" and len(kids) > 1 and \
            all(c.kind == "leaf" or (c.kind == "list" and all(g.kind == "leaf" for g in c.children)) for c in kids):
        parts, start = [], 0
        for c in kids:
            parts.append(start if c.kind == "leaf" else slice(start, start + c.num_leaves))
            start += c.num_leaves
        return itemgetter(*parts)
    return partial(tree_unflatten, treedef)


def _build(node: PyTreeDef, it: Any) -> Any:
    # A module-level function rather than a recursive closure: a closure that calls itself is
    # a reference cycle, which kept the leaves (large output arrays) alive until the next
    # garbage collection.
    if node.kind == "leaf":
        return next(it)
    return _BUILD[node.kind](node, [next(it) if c is LEAF else _build(c, it) for c in node.children])


def _build_defaultdict(node: PyTreeDef, kids: list[Any]) -> defaultdict:
    factory, keys = node.keys
    return defaultdict(factory, zip(keys, kids))


_BUILD: dict[str, Callable[[PyTreeDef, list[Any]], Any]] = {
    "none": lambda node, kids: None,
    "tuple": lambda node, kids: tuple(kids),
    "list": lambda node, kids: kids,
    "dict": lambda node, kids: dict(zip(node.keys, kids)),
    "namedtuple": lambda node, kids: node.keys[0](*kids),
    "odict": lambda node, kids: OrderedDict(zip(node.keys, kids)),
    "defaultdict": _build_defaultdict,
    "custom": lambda node, kids: _REGISTERED[node.keys[0]].unflatten(node.keys[1], kids),
}


def _describe(kind: str, keys: tuple[Any, ...], count: int) -> str:
    """A node in words, for structure mismatches."""
    if kind == "none":
        return "None"
    if kind in ("tuple", "list"):
        return f"a {kind} of {count}"
    if kind in ("dict", "odict"):
        return f"{'a dict' if kind == 'dict' else 'an OrderedDict'} with keys {list(keys)}"
    if kind == "defaultdict":
        return f"a defaultdict with keys {list(keys[1])}"
    if kind == "namedtuple":
        return f"a {keys[0].__name__}"
    return f"a {keys[0].__name__} with aux data {keys[1]!r} and {count} children"


def _up_to(node: PyTreeDef, tree: Any, path: str, out: list[Any]) -> None:
    if node.kind == "leaf":
        out.append(tree)
        return
    split = _node_split(tree.__class__)
    if split is None:
        raise _Mismatch(path, f"expected {_describe(node.kind, node.keys, len(node.children))}, "
                              f"got a leaf of type {type(tree).__name__}")
    kind, kids, keys = split(tree)
    if kind != node.kind or keys != node.keys or len(kids) != len(node.children):
        raise _Mismatch(path, f"expected {_describe(node.kind, node.keys, len(node.children))}, "
                              f"got {_describe(kind, keys, len(kids))}")
    for step, child, kid in zip(_steps(node), node.children, kids):
        _up_to(child, kid, path + step, out)


class _Mismatch(Exception):
    """Where and how a tree departs from a structure; `flatten_up_to` words it."""

    def __init__(self, path: str, detail: str):
        super().__init__(detail)
        self.path, self.detail = path, detail


def flatten_up_to(treedef: PyTreeDef, tree: Any, what: str) -> list[Any]:
    """`treedef.flatten_up_to(tree)`, the error beginning with `what`."""
    out: list[Any] = []
    try:
        _up_to(treedef, tree, "", out)
    except _Mismatch as bad:
        where = f"at {bad.path}" if bad.path else "at its root"
        raise TreeStructureError(f"{what} {where}: {bad.detail} {_where()}") from None
    return out


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any, is_leaf: IsLeaf = None) -> Any:
    """`fn` applied leaf by leaf: to each leaf of `tree` and the matching subtree of each of
    `rest`, which must have tree's structure (or have it as a prefix); the result has tree's
    structure."""
    leaves, treedef = tree_flatten(tree, is_leaf)
    others = [flatten_up_to(treedef, other, f"tree_map: tree {i} does not have the structure of tree 0")
              for i, other in enumerate(rest, start=1)]
    return tree_unflatten(treedef, [fn(*xs) for xs in zip(leaves, *others)])


@dataclass(frozen=True)
class DictKey:
    """The step to a dict's (OrderedDict's, defaultdict's) child: its key."""

    key: Hashable

    def __str__(self) -> str:
        return f"[{self.key!r}]"


@dataclass(frozen=True)
class SequenceKey:
    """The step to a tuple's or list's child: its index."""

    idx: int

    def __str__(self) -> str:
        return f"[{self.idx}]"


@dataclass(frozen=True)
class GetAttrKey:
    """The step to a namedtuple's or a registered dataclass's child: the field's name."""

    name: str

    def __str__(self) -> str:
        return f".{self.name}"


@dataclass(frozen=True)
class FlattenedIndexKey:
    """The step to a child of a registered node whose children have no names: its position."""

    key: int

    def __str__(self) -> str:
        return f"[{self.key}]"


PathKey = DictKey | SequenceKey | GetAttrKey | FlattenedIndexKey


def _path_keys(treedef: PyTreeDef) -> list[PathKey]:
    """The key of the step to each child of a node (JAX's key classes for its kind)."""
    if treedef.kind == "namedtuple":
        return [GetAttrKey(name) for name in treedef.keys[0]._fields]
    if treedef.kind == "custom":
        names = _REGISTERED[treedef.keys[0]].names
        if names is not None:
            return [GetAttrKey(name) for name in names]
        return [FlattenedIndexKey(i) for i in range(len(treedef.children))]
    if treedef.kind in ("dict", "odict"):
        return [DictKey(k) for k in treedef.keys]
    if treedef.kind == "defaultdict":
        return [DictKey(k) for k in treedef.keys[1]]
    return [SequenceKey(i) for i in range(len(treedef.children))]


def _steps(treedef: PyTreeDef) -> list[str]:
    """The path step to each child of a node, as text."""
    return [str(k) for k in _path_keys(treedef)]


def leaf_key_paths(treedef: PyTreeDef, prefix: tuple[PathKey, ...] = ()) -> list[tuple[PathKey, ...]]:
    """The key path (a tuple of DictKey, SequenceKey, ... from the root) to each leaf, in
    flattening order."""
    if treedef.kind == "leaf":
        return [prefix]
    return [p for key, c in zip(_path_keys(treedef), treedef.children) for p in leaf_key_paths(c, prefix + (key,))]


def leaf_paths(treedef: PyTreeDef, prefix: str = "") -> list[str]:
    """A readable path (`[0]['w']`, `.w` for a namedtuple field or a dataclass field) for each
    leaf, in flattening order."""
    return [prefix + "".join(map(str, path)) for path in leaf_key_paths(treedef)]
