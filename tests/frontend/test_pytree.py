"""Pytrees: flattening and rebuilding nested tuples, lists, dicts, namedtuples, OrderedDicts and
None, and jit over them."""
from collections import OrderedDict, namedtuple

import numpy as np
from hypothesis import given, strategies as st

import glue
from glue.frontend.pytree import leaf_paths, tree_flatten, tree_map, tree_unflatten

Pair = namedtuple("Pair", "first second")

pytrees = st.recursive(
    st.one_of(st.none(), st.integers()),
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.lists(kids, max_size=3).map(tuple),
                           st.dictionaries(st.text("abc", max_size=2), kids, max_size=3),
                           st.tuples(kids, kids).map(lambda t: Pair(*t)),
                           st.lists(st.tuples(st.text("abc", max_size=2), kids), max_size=3).map(OrderedDict)),
    max_leaves=12)


@given(pytrees)
def test_flatten_unflatten_round_trip(tree):
    leaves, treedef = tree_flatten(tree)
    assert all(isinstance(leaf, int) for leaf in leaves)  # None is structure, not a leaf
    assert treedef.num_leaves == len(leaves) == len(leaf_paths(treedef))
    rebuilt = tree_unflatten(treedef, leaves)
    assert rebuilt == tree and type(rebuilt) is type(tree)


@given(pytrees)
def test_structure_ignores_leaf_values(tree):
    moved = tree_map(lambda v: v + 1, tree)
    _, a = tree_flatten(tree)
    _, b = tree_flatten(moved)
    assert a == b and hash(a) == hash(b)
    assert tree_flatten(moved)[0] == [v + 1 for v in tree_flatten(tree)[0]]


def test_dicts_flatten_in_sorted_key_order():
    leaves, treedef = tree_flatten({"b": 1, "a": (2, None, [3])})
    assert leaves == [2, 3, 1]
    assert str(treedef) == "{'a': (*, None, [*]), 'b': *}"
    assert leaf_paths(treedef, "x") == ["x['a'][0]", "x['a'][2][0]", "x['b']"]


def test_tuples_and_lists_are_different_structures():
    assert tree_flatten((1, 2))[1] != tree_flatten([1, 2])[1]
    assert str(tree_flatten((1,))[1]) == "(*,)"


def test_tree_map_over_several_trees():
    assert tree_map(lambda a, b: a * b, {"x": 2, "y": (3,)}, {"x": 5, "y": (7,)}) == {"x": 10, "y": (21,)}


def test_jit_takes_and_returns_pytrees():
    @glue.jit(backend="reference")
    def f(params, batch):
        w, b = params["w"], params["b"]
        return {"out": [batch * w + b, None], "pair": (w, batch)}

    w, b, batch = np.float32([1, 2]), np.float32([3, 4]), np.float32([5, 6])
    out = f({"w": w, "b": b}, batch)
    assert set(out) == {"out", "pair"} and out["out"][1] is None
    assert isinstance(out["out"], list) and isinstance(out["pair"], tuple)
    np.testing.assert_array_equal(out["out"][0], batch * w + b)
    np.testing.assert_array_equal(out["pair"][1], batch)
    graph = glue.make_ir(f)({"w": w, "b": b}, batch).graph
    assert len(graph.invars) == 3 and len(graph.outvars) == 3


def test_jit_returns_a_bare_array_and_an_empty_structure():
    assert isinstance(glue.jit(lambda x: x, backend="reference")(np.float32([1])), glue.Array)
    assert glue.jit(lambda x: (), backend="reference")(np.float32([1])) == ()
    assert glue.jit(lambda x: None, backend="reference")(np.float32([1])) is None


def test_namedtuples_and_ordered_dicts_are_nodes_under_jit_and_grad():
    Params = namedtuple("Params", "w b")
    p = Params(np.ones((3, 2), np.float32), np.zeros(2, np.float32))
    x = np.ones((4, 3), np.float32)
    loss = lambda p, x: ((x @ p.w + p.b) ** 2).sum()  # noqa: E731
    g = glue.jit(glue.grad(loss), backend="cpu")(p, x)
    assert type(g) is Params
    np.testing.assert_allclose(np.asarray(g.b), np.full(2, 2 * 4 * 3.0))
    ordered = OrderedDict([("z", np.ones(2, np.float32)), ("a", np.zeros(2, np.float32))])
    out = glue.jit(lambda d: OrderedDict((k, v + 1) for k, v in d.items()), backend="cpu")(ordered)
    assert type(out) is OrderedDict and list(out) == ["z", "a"]
    assert leaf_paths(tree_flatten(p)[1]) == [".w", ".b"]
