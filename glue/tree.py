"""`glue.tree`: the short names of `glue.tree_util` (as `jax.tree` has them)."""
from glue.tree_util import tree_all as all
from glue.tree_util import tree_flatten as flatten
from glue.tree_util import tree_flatten_with_path as flatten_with_path
from glue.tree_util import tree_leaves as leaves
from glue.tree_util import tree_leaves_with_path as leaves_with_path
from glue.tree_util import tree_map as map
from glue.tree_util import tree_map_with_path as map_with_path
from glue.tree_util import tree_reduce as reduce
from glue.tree_util import tree_structure as structure
from glue.tree_util import tree_unflatten as unflatten

__all__ = ["all", "flatten", "flatten_with_path", "leaves", "leaves_with_path", "map", "map_with_path", "reduce",
           "structure", "unflatten"]
