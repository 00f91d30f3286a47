"""glue.tree_util and glue.tree with JAX's semantics: structure checks in tree_map, is_leaf,
registered node types (functions, classes, dataclasses, Partial) through jit, grad and vmap."""
import dataclasses
from collections import OrderedDict, defaultdict, namedtuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import glue
import glue.numpy as gnp
from glue import tree, tree_util
from glue.tree_util import TreeStructureError

api = pytest.mark.jax_api
Pair = namedtuple("Pair", "first second")


@tree_util.register_pytree_node_class
class Box:
    """A registered class with aux data (its label)."""

    def __init__(self, value, label):
        self.value, self.label = value, label

    def tree_flatten(self):
        return (self.value,), self.label

    @classmethod
    def tree_unflatten(cls, label, children):
        return cls(children[0], label)

    def __eq__(self, other):
        return type(other) is Box and other.label == self.label and other.value == self.value


@tree_util.register_dataclass
@dataclasses.dataclass
class Linear:
    w: object
    b: object
    activation: str = dataclasses.field(default="relu", metadata=dict(static=True))


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


tree_util.register_pytree_node(Point, lambda p: ((p.x, p.y), None), lambda aux, kids: Point(*kids))

leaves = st.integers(-5, 5)
pytrees = st.recursive(
    st.one_of(st.none(), leaves),
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.text("abc", max_size=2), kids, max_size=3),
        st.tuples(kids, kids).map(lambda t: Pair(*t)),
        st.tuples(kids, st.sampled_from(["a", "b"])).map(lambda t: Box(*t)),
        st.tuples(kids, kids).map(lambda t: Linear(*t)),
        st.dictionaries(st.text("ab", max_size=2), kids, max_size=2).map(lambda d: defaultdict(list, d)),
        st.lists(st.tuples(st.text("abc", max_size=2), kids), max_size=3).map(OrderedDict)),
    max_leaves=10)


@api("jax.tree_util.tree_flatten", "jax.tree_util.tree_unflatten", "jax.tree_util.tree_leaves",
     "jax.tree_util.tree_structure")
@given(pytrees)
def test_flatten_round_trips_every_node_type(t):
    flat, treedef = tree_util.tree_flatten(t)
    assert flat == tree_util.tree_leaves(t) and treedef == tree_util.tree_structure(t)
    assert treedef.num_leaves == len(flat)
    rebuilt = tree_util.tree_unflatten(treedef, flat)
    assert rebuilt == t if not isinstance(t, Linear) else tree_util.tree_leaves(rebuilt) == flat
    assert type(rebuilt) is type(t) and treedef.unflatten(flat) == rebuilt


@api("jax.tree_util.tree_map")
@given(pytrees)
def test_tree_map_keeps_the_structure(t):
    doubled = tree_util.tree_map(lambda v: 2 * v, t)
    assert tree_util.tree_structure(doubled) == tree_util.tree_structure(t)
    assert tree_util.tree_leaves(doubled) == [2 * v for v in tree_util.tree_leaves(t)]
    summed = tree_util.tree_map(lambda a, b: a + b, t, doubled)
    assert tree_util.tree_leaves(summed) == [3 * v for v in tree_util.tree_leaves(t)]


@api("jax.tree_util.tree_map")
def test_tree_map_rejects_trees_of_another_structure_and_names_where():
    cases = [
        ({"a": 1, "b": (2, 3)}, {"a": 1, "b": [2, 3]}, r"at \['b'\]: expected a tuple of 2, got a list of 2"),
        ([1, 2], [1, 2, 3], "at its root: expected a list of 2, got a list of 3"),
        ({"a": 1}, {"b": 1}, r"expected a dict with keys \['a'\], got a dict with keys \['b'\]"),
        ((1, (2,)), (1, 5), r"at \[1\]: expected a tuple of 1, got a leaf of type int"),
        (Box(1, "a"), Box(1, "b"), "aux data 'a'"),
        (Pair(1, 2), (1, 2), "expected a Pair"),
    ]
    for first, second, message in cases:
        with pytest.raises(TreeStructureError, match=message):
            tree_util.tree_map(lambda a, b: a, first, second)
    with pytest.raises(TreeStructureError, match="test_tree_util.py"):  # the user's line
        tree.map(lambda a, b: a, [1], [1, 2])


@api("jax.tree_util.tree_map")
def test_tree_map_takes_the_first_tree_as_a_prefix_of_the_others():
    out = tree_util.tree_map(lambda a, b: (a, b), [1, 2], [(3, 4), {"x": 5}])
    assert out == [(1, (3, 4)), (2, {"x": 5})]
    assert tree_util.tree_map(lambda a, b: a, {"w": None}, {"w": None}) == {"w": None}


@api("jax.tree_util.tree_map", "jax.tree_util.tree_leaves")
def test_is_leaf_stops_the_walk():
    t = {"a": (1, 2), "b": [(3, 4)]}
    assert tree_util.tree_leaves(t, is_leaf=lambda x: isinstance(x, tuple)) == [(1, 2), (3, 4)]
    assert tree_util.tree_map(len, t, is_leaf=lambda x: isinstance(x, tuple)) == {"a": 2, "b": [2]}
    assert tree_util.tree_leaves([None, 1], is_leaf=lambda x: x is None) == [None, 1]


@api("jax.tree_util.tree_unflatten")
def test_unflatten_needs_exactly_the_leaves():
    treedef = tree_util.tree_structure({"a": 1, "b": (2, 3)})
    with pytest.raises(TreeStructureError, match="has 3 leaves, but 2 were given"):
        tree_util.tree_unflatten(treedef, [1, 2])
    assert str(treedef) == "{'a': *, 'b': (*, *)}" and treedef.num_nodes == 5


@api("jax.tree_util.register_pytree_node", "jax.tree_util.register_pytree_node_class",
     "jax.tree_util.register_dataclass")
def test_registered_nodes_flatten_their_children_and_keep_aux_data():
    layer = Linear(np.ones(2, np.float32), np.zeros(2, np.float32), "tanh")
    flat, treedef = tree_util.tree_flatten(layer)
    assert len(flat) == 2 and str(treedef) == "CustomNode(Linear[('tanh',)], [*, *])"
    assert tree_util.tree_structure(Linear(1, 2, "relu")) != treedef  # aux data is structure
    assert tree_util.tree_leaves(Point(1, (2, 3))) == [1, 2, 3]
    assert tree_util.tree_unflatten(*reversed(tree_util.tree_flatten(Box(4, "x")))) == Box(4, "x")
    with pytest.raises(TreeStructureError, match="already a pytree node"):
        tree_util.register_pytree_node(Point, lambda p: ((), None), lambda a, k: None)
    with pytest.raises(TreeStructureError, match="data_fields and meta_fields"):
        tree_util.register_dataclass(Point)

    @tree_util.register_pytree_node_class
    class Unhashable:
        def tree_flatten(self):
            return (), ["not", "hashable"]

        @classmethod
        def tree_unflatten(cls, aux, children):
            return cls()

    with pytest.raises(TreeStructureError, match="not hashable"):
        tree_util.tree_flatten(Unhashable())


@api("jax.tree_util.register_dataclass", "jax.tree_util.register_pytree_node_class")
def test_registered_nodes_as_jit_arguments_and_results_and_through_grad_and_vmap():
    layer = Linear(np.float32([1, -2]), np.float32([0.5, 0.5]), "relu")

    def apply(layer, x):
        y = x * layer.w + layer.b
        return Linear(y, Box(gnp.sum(y), layer.activation), layer.activation)

    for backend in ("reference", "cpu"):
        out = glue.jit(apply, backend=backend)(layer, np.float32(3))
        assert isinstance(out, Linear) and out.activation == "relu" and out.b.label == "relu"
        np.testing.assert_allclose(np.asarray(out.w), [3.5, -5.5])
        np.testing.assert_allclose(float(out.b.value), -2.0)

    loss = lambda layer, x: gnp.sum(apply(layer, x).w ** 2)  # noqa: E731
    grads = glue.grad(loss)(layer, np.float32(3))
    assert isinstance(grads, Linear) and grads.activation == "relu"
    np.testing.assert_allclose(np.asarray(grads.w), 2 * np.float32([3.5, -5.5]) * 3)
    np.testing.assert_allclose(np.asarray(grads.b), 2 * np.float32([3.5, -5.5]))
    stacked = Linear(np.ones((4, 2), np.float32), np.arange(8, dtype=np.float32).reshape(4, 2), "relu")
    batched = glue.vmap(lambda p: gnp.sum(p.w * p.b))(stacked)
    np.testing.assert_allclose(np.asarray(batched), [1, 5, 9, 13])


@api("jax.tree_util.Partial")
def test_partial_is_a_pytree_with_its_function_as_aux_data():
    scale = tree_util.Partial(gnp.multiply, np.float32(3))
    assert tree_util.tree_leaves(scale) == [np.float32(3)]
    assert float(glue.jit(lambda f, x: f(x), backend="reference")(scale, np.float32(2))) == 6.0
    returned = glue.jit(lambda a: tree_util.Partial(gnp.add, a), backend="reference")(np.float32(1))
    assert isinstance(returned, tree_util.Partial) and float(returned(np.float32(2))) == 3.0
    nested = tree_util.Partial(tree_util.Partial(gnp.add), 1)
    assert nested.func is gnp.add and nested.args == (1,)
    grads = glue.grad(lambda f, x: f(x))(scale, np.float32(2.0))  # with respect to the bound 3
    assert isinstance(grads, tree_util.Partial) and float(grads.args[0]) == 2.0


@api("jax.tree_util.tree_reduce", "jax.tree_util.tree_all")
def test_reduce_and_all():
    assert tree_util.tree_reduce(lambda a, b: a + b, {"a": 1, "b": (2, 3)}) == 6
    assert tree_util.tree_reduce(lambda a, b: a * b, [], 7) == 7
    assert tree_util.tree_all([True, (1, {"x": True})]) and not tree_util.tree_all([True, (0,)])


@api("jax.tree.map", "jax.tree.leaves", "jax.tree.structure", "jax.tree.flatten", "jax.tree.unflatten",
     "jax.tree.reduce", "jax.tree.all")
def test_tree_aliases():
    t = {"b": [1, 2], "a": 3}
    assert tree.leaves(t) == [3, 1, 2] and tree.map(lambda v: v * 10, t) == {"a": 30, "b": [10, 20]}
    flat, treedef = tree.flatten(t)
    assert tree.unflatten(treedef, flat) == t and tree.structure(t) == treedef
    assert tree.reduce(max, t) == 3 and tree.all(t)


@api("jax.tree_util.tree_flatten_with_path", "jax.tree_util.tree_leaves_with_path", "jax.tree_util.keystr",
     "jax.tree.flatten_with_path", "jax.tree.leaves_with_path")
def test_key_paths_name_every_step_with_jax_key_classes():
    t = {"blocks": [{"w": 1}], "pair": Pair(2, (3, None)), "od": OrderedDict(z=4), "lin": Linear(5, 6),
         "point": Point(7, 8)}
    with_paths, treedef = tree_util.tree_flatten_with_path(t)
    assert treedef == tree_util.tree_structure(t) and [v for _, v in with_paths] == tree_util.tree_leaves(t)
    paths = {v: p for p, v in with_paths}
    DictKey, SequenceKey, GetAttrKey = tree_util.DictKey, tree_util.SequenceKey, tree_util.GetAttrKey
    assert paths[1] == (DictKey("blocks"), SequenceKey(0), DictKey("w"))
    assert paths[3] == (DictKey("pair"), GetAttrKey("second"), SequenceKey(0))
    assert paths[4] == (DictKey("od"), DictKey("z")) and paths[6] == (DictKey("lin"), GetAttrKey("b"))
    assert paths[8] == (DictKey("point"), tree_util.FlattenedIndexKey(1))
    assert tree_util.keystr(paths[1]) == "['blocks'][0]['w']" and tree_util.keystr(paths[3]) == "['pair'].second[0]"
    assert tree_util.keystr(paths[1], simple=True) == "blocks/0/w"
    assert tree_util.keystr(paths[3], simple=True, separator=".") == "pair.second.0"
    assert repr(paths[8][1]) == "FlattenedIndexKey(key=1)" and paths[1][0].key == "blocks"
    assert tree.leaves_with_path([5]) == tree_util.tree_leaves_with_path([5]) == [((SequenceKey(0),), 5)]
    assert tree.flatten_with_path(t) == (with_paths, treedef)


@api("jax.tree_util.tree_map_with_path", "jax.tree.map_with_path")
def test_tree_map_with_path_passes_the_path_first_and_checks_the_other_trees():
    params = {"layer": {"w": 1.0, "b": 2.0}, "scale": 3.0}
    decayed = tree_util.tree_map_with_path(lambda path, _: path[-1].key == "w", params)
    assert decayed == {"layer": {"w": True, "b": False}, "scale": False}
    named = tree.map_with_path(lambda path, a, b: (tree_util.keystr(path), a + b), params, params)
    assert named == {"layer": {"w": ("['layer']['w']", 2.0), "b": ("['layer']['b']", 4.0)}, "scale": ("['scale']", 6.0)}
    assert tree_util.tree_map_with_path(lambda path, t: len(path), [(1, 2)], is_leaf=lambda x: isinstance(x, tuple)) == [1]
    with pytest.raises(TreeStructureError, match=r"tree_map_with_path: tree 1 .* at \['layer'\]"):
        tree_util.tree_map_with_path(lambda path, a, b: a, params, {"layer": {"w": 1}, "scale": 3})
