"""The dependency graph of the kernels fusion is forming, kept in a topological order as it
changes (Pearce and Kelly's dynamic topological sort): `rank` grows along every edge, so a search
for a path between two kernels only visits the kernels ranked between them, and an edge or a
merge reorders only those. Fusion asks it whether a kernel may write a value for kernels that
read it (no cycle) and whether two kernels may merge (no path through a third)."""
from __future__ import annotations

import heapq
from typing import Any, Callable, Iterable


class KernelDag:
    """Kernels (by id) and edges from each kernel to those that read what it writes."""

    def __init__(self) -> None:
        self.succ: dict[int, dict[int, int]] = {}  # kernel -> consumer -> values passed
        self.pred: dict[int, dict[int, int]] = {}
        self.rank: dict[int, int] = {}
        self._lowest = 0

    def add_node(self, n: int) -> None:
        """A kernel ranked before every other (fusion creates producers after their consumers)."""
        self._lowest -= 1
        self.rank[n], self.succ[n], self.pred[n] = self._lowest, {}, {}

    def _search(self, starts: Iterable[int], edges: dict[int, dict[int, int]],
                inside: Callable[[int], bool]) -> set[int]:
        """The kernels reachable from `starts` along `edges` through kernels `inside` accepts."""
        found, stack = set(), [s for s in starts if inside(s)]
        found.update(stack)
        while stack:
            for n in edges[stack.pop()]:
                if n not in found and inside(n):
                    found.add(n)
                    stack.append(n)
        return found

    def reaches(self, sources: Iterable[int], target: int) -> bool:
        """Whether a kernel of `sources` reaches `target`.

        Searched from both ends at once, a step at a time on the side with the smaller frontier:
        forward from the sources through kernels ranked below `target`, backward from `target`
        through kernels ranked from the lowest source up. A path shows as a kernel (or an edge)
        the two searches share; there is none once either search has run out. Either search
        alone answers the same, but in a deep program one of them often spans most of the graph
        (from a forward kernel, everything up to a backward one) while the other is a few
        kernels, and a path, when there is one, is met from both ends well before either ends."""
        limit = self.rank[target]
        ahead = {s for s in sources if self.rank[s] < limit}
        if not ahead:
            return False
        low = min(self.rank[s] for s in ahead)
        behind = {target}
        forward, backward = list(ahead), [target]
        while forward and backward:
            if len(forward) <= len(backward):
                for n in self.succ[forward.pop()]:
                    if n in behind:
                        return True
                    if n not in ahead and self.rank[n] < limit:
                        ahead.add(n)
                        forward.append(n)
            else:
                for n in self.pred[backward.pop()]:
                    if n in ahead:
                        return True
                    if n not in behind and self.rank[n] >= low:
                        behind.add(n)
                        backward.append(n)
        return False

    def add_edge(self, u: int, v: int) -> None:
        """u -> v, which must not close a cycle (see `reaches`)."""
        if self.rank[v] < self.rank[u]:
            lo, hi = self.rank[v], self.rank[u]
            later = self._search([v], self.succ, lambda n: self.rank[n] < hi)
            earlier = self._search([u], self.pred, lambda n: self.rank[n] > lo)
            self._reorder(sorted(earlier, key=self.rank.get), [], sorted(later, key=self.rank.get))
        self.succ[u][v] = self.succ[u].get(v, 0) + 1
        self.pred[v][u] = self.pred[v].get(u, 0) + 1

    def _reorder(self, first: list[int], middle: list[int], last: list[int], spare: Iterable[int] = ()) -> None:
        """Give `first`, then `middle`, then `last` the ranks they (and `spare`) held, in order."""
        pool = sorted([self.rank[n] for n in first + middle + last] + list(spare))
        for n, r in zip(first + middle, pool):
            self.rank[n] = r
        for n, r in zip(last, pool[len(pool) - len(last):]):
            self.rank[n] = r

    def path_between(self, a: int, b: int) -> bool:
        """Whether one of a, b reaches the other through a third kernel."""
        lo, hi = sorted((a, b), key=self.rank.get)
        return self.reaches((n for n in self.succ[lo] if n != hi), hi)

    def merge(self, keep: int, gone: int) -> None:
        """Make `gone` part of `keep` (no path between them through a third kernel)."""
        lo, hi = sorted((keep, gone), key=self.rank.get)
        low, high = self.rank[lo], self.rank[hi]
        later = self._search((n for n in self.succ[lo] if n != hi), self.succ, lambda n: self.rank[n] < high)
        earlier = self._search((n for n in self.pred[hi] if n != lo), self.pred, lambda n: self.rank[n] > low)
        spare = [self.rank[n] for n in (lo, hi) if n != keep]
        self._reorder(sorted(earlier, key=self.rank.get), [keep], sorted(later, key=self.rank.get), spare)
        for edges, back in ((self.succ, self.pred), (self.pred, self.succ)):
            for n, count in edges.pop(gone).items():
                del back[n][gone]
                if n != keep:
                    edges[keep][n] = edges[keep].get(n, 0) + count
                    back[n][keep] = back[n].get(keep, 0) + count
        del self.rank[gone]

    def order(self, priority: Callable[[int], Any]) -> list[int]:
        """Every kernel after those it depends on; of the kernels ready, the one of least
        `priority` first."""
        waiting = {n: len(preds) for n, preds in self.pred.items()}
        ready = [(priority(n), n) for n, count in waiting.items() if count == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for s in self.succ[n]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    heapq.heappush(ready, (priority(s), s))
        return order
