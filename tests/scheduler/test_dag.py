"""The kernel dependency graph fusion keeps: after any sequence of new kernels, edges and merges,
ranks grow along every edge, and its path queries agree with a brute-force search."""
from hypothesis import given, settings
from hypothesis import strategies as st

from glue.scheduler.dag import KernelDag


def reachable(dag, start):
    seen, stack = set(), [start]
    while stack:
        for n in dag.succ[stack.pop()]:
            if n not in seen:
                seen.add(n)
                stack.append(n)
    return seen


def path_through_a_third(dag, a, b):
    return any(b in reachable(dag, n) for n in dag.succ[a] if n != b) or \
        any(a in reachable(dag, n) for n in dag.succ[b] if n != a)


def assert_consistent(dag):
    for u, succs in dag.succ.items():
        for v in succs:
            assert dag.rank[u] < dag.rank[v]
            assert u in dag.pred[v]
    assert len(set(dag.rank.values())) == len(dag.rank)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["node", "edge", "merge"]), st.integers(0, 10 ** 6),
                          st.integers(0, 10 ** 6)), max_size=60))
def test_ranks_stay_topological_and_paths_are_found(ops):
    dag, nodes = KernelDag(), []
    for step, (op, x, y) in enumerate(ops):
        if op == "node" or len(nodes) < 2:
            nodes.append(step)
            dag.add_node(step)
            continue
        a, b = nodes[x % len(nodes)], nodes[y % len(nodes)]
        if a == b:
            continue
        if op == "edge":
            closes_cycle = a in reachable(dag, b)
            assert dag.reaches([b], a) == closes_cycle
            if not closes_cycle:
                dag.add_edge(a, b)
        else:
            through = path_through_a_third(dag, a, b)
            assert dag.path_between(a, b) == through
            if not through:
                dag.merge(a, b)
                nodes.remove(b)
        assert_consistent(dag)
    order = dag.order(lambda n: n)
    assert sorted(order) == sorted(nodes)
    position = {n: k for k, n in enumerate(order)}
    assert all(position[u] < position[v] for u in dag.succ for v in dag.succ[u])
