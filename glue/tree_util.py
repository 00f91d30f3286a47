"""`glue.tree_util`: JAX's pytree API over glue's pytrees (glue/frontend/pytree.py).

Registered node types work wherever pytrees do: as arguments and results of `glue.jit`, `grad`,
`vmap`, ... Their aux data is part of the structure, so it must be hashable, and a jitted
function retraces when it changes.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Hashable, Iterable, Sequence, TypeVar

from glue.frontend.pytree import (DictKey, FlattenedIndexKey, GetAttrKey, PathKey, PyTreeDef, SequenceKey,
                                  TreeStructureError, flatten_up_to, leaf_key_paths, register_node,
                                  tree_flatten, tree_leaves, tree_map, tree_structure, tree_unflatten)

T = TypeVar("T", bound=type)
_NO_INITIAL = object()


def register_pytree_node(nodetype: type, flatten_func: Callable[[Any], tuple[Iterable[Any], Hashable]],
                         unflatten_func: Callable[[Hashable, Iterable[Any]], Any]) -> None:
    """Make `nodetype` a pytree node: flatten_func(x) -> (children, aux_data) and
    unflatten_func(aux_data, children) -> x."""
    register_node(nodetype, flatten_func, unflatten_func)


def register_pytree_node_class(cls: T) -> T:
    """Class decorator: `cls` flattens with its method `tree_flatten()` -> (children, aux_data)
    and rebuilds with its classmethod `tree_unflatten(aux_data, children)`."""
    register_node(cls, lambda x: x.tree_flatten(), cls.tree_unflatten)
    return cls


def register_dataclass(nodetype: T, data_fields: Sequence[str] | None = None,
                       meta_fields: Sequence[str] | None = None, drop_fields: Sequence[str] = ()) -> T:
    """Make a dataclass-like `nodetype` a node: `data_fields` are its children, `meta_fields` its
    (static, hashable) aux data. For a dataclass both may be left out: fields whose metadata has
    static=True are meta fields, the others (less `drop_fields`) data fields."""
    if (data_fields is None) != (meta_fields is None):
        raise TreeStructureError("register_dataclass: give both data_fields and meta_fields, or "
                                 "neither (for a dataclass)")
    if data_fields is None:
        if not dataclasses.is_dataclass(nodetype):
            raise TreeStructureError(f"register_dataclass: {nodetype.__name__} is not a dataclass, "
                                     "so data_fields and meta_fields are needed")
        fields = [f for f in dataclasses.fields(nodetype) if f.name not in drop_fields]
        data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
        meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
    data, meta = tuple(data_fields), tuple(meta_fields)

    def flatten(x: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return tuple(getattr(x, name) for name in data), tuple(getattr(x, name) for name in meta)

    def unflatten(aux: tuple[Any, ...], children: Iterable[Any]) -> Any:
        return nodetype(**dict(zip(data, children)), **dict(zip(meta, aux)))

    register_node(nodetype, flatten, unflatten, names=data)
    return nodetype


class Partial(functools.partial):
    """`functools.partial` as a pytree: the bound arguments are its children and the function
    its aux data, so a Partial can be passed to and returned from jitted functions."""

    def __new__(cls, func: Callable[..., Any], *args: Any, **kwargs: Any) -> "Partial":
        if isinstance(func, functools.partial):  # flatten nested partials into one
            args, kwargs = func.args + args, {**func.keywords, **kwargs}
            func = func.func
        return super().__new__(cls, func, *args, **kwargs)


register_node(Partial, lambda p: ((p.args, p.keywords), p.func),
              lambda func, children: Partial(func, *children[0], **children[1]))


def tree_reduce(function: Callable[[Any, Any], Any], tree: Any, initializer: Any = _NO_INITIAL,
                is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """`functools.reduce` over the leaves of `tree`."""
    leaves = tree_leaves(tree, is_leaf)
    if initializer is _NO_INITIAL:
        return functools.reduce(function, leaves)
    return functools.reduce(function, leaves, initializer)


def tree_all(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """Whether every leaf of `tree` is truthy."""
    return all(tree_leaves(tree, is_leaf))


def treedef_is_leaf(treedef: PyTreeDef) -> bool:
    return treedef.kind == "leaf"


KeyPath = tuple[PathKey, ...]


def tree_flatten_with_path(tree: Any, is_leaf: Callable[[Any], bool] | None = None
                           ) -> tuple[list[tuple[KeyPath, Any]], PyTreeDef]:
    """`tree_flatten`, each leaf paired with its key path: the DictKey / SequenceKey /
    GetAttrKey / FlattenedIndexKey of every step from the root down to it."""
    leaves, treedef = tree_flatten(tree, is_leaf)
    return list(zip(leaf_key_paths(treedef), leaves)), treedef


def tree_leaves_with_path(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[tuple[KeyPath, Any]]:
    """The (key path, leaf) pairs of `tree`, in flattening order."""
    return tree_flatten_with_path(tree, is_leaf)[0]


def tree_map_with_path(fn: Callable[..., Any], tree: Any, *rest: Any,
                       is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """`tree_map` whose `fn` also gets each leaf's key path first: fn(path, leaf, *others)."""
    with_paths, treedef = tree_flatten_with_path(tree, is_leaf)
    others = [flatten_up_to(treedef, other, f"tree_map_with_path: tree {i} does not have the structure of tree 0")
              for i, other in enumerate(rest, start=1)]
    return tree_unflatten(treedef, [fn(path, leaf, *xs) for (path, leaf), *xs in zip(with_paths, *others)])


def _simple(key: PathKey) -> str:
    if isinstance(key, DictKey):
        return str(key.key)
    if isinstance(key, SequenceKey):
        return str(key.idx)
    if isinstance(key, GetAttrKey):
        return key.name
    return str(key.key)


def keystr(keys: KeyPath, *, simple: bool = False, separator: str = "/") -> str:
    """A key path as text: `['blocks'][0]['w']`, or with simple=True the bare keys joined by
    `separator` (`blocks/0/w`)."""
    if simple:
        return separator.join(map(_simple, keys))
    return "".join(map(str, keys))


__all__ = ["DictKey", "FlattenedIndexKey", "GetAttrKey", "KeyPath", "PyTreeDef", "Partial", "SequenceKey",
           "TreeStructureError", "flatten_up_to", "keystr", "register_dataclass", "register_pytree_node",
           "register_pytree_node_class", "tree_all", "tree_flatten", "tree_flatten_with_path", "tree_leaves",
           "tree_leaves_with_path", "tree_map", "tree_map_with_path", "tree_reduce", "tree_structure",
           "tree_unflatten", "treedef_is_leaf"]
