"""The stream plan: which stream each kernel runs on, and which events order them.

Kernels form a DAG through the values they pass (a kernel depends on the kernels that produce
its inputs). The plan walks the kernels in program order and puts each one on a stream:

- the stream of a producer it depends on, when that producer is still the stream's last
  kernel and this kernel is the producer's heir: of the producer's consumers, the one with the
  longest chain of kernels still to run after it. The critical path thus stays on one stream,
  where a dependency costs nothing (work on one stream runs in order, and on sm_90 the next
  kernel launches early: see the cuda executor), and side work (a loss, a weight gradient)
  branches off instead of holding the chain back;
- otherwise a stream whose last kernel already happens before it (and is not waiting for its
  heir), or a new stream while fewer than `max_streams` exist, so that independent branches
  overlap on the device;
- otherwise the stream whose last kernel is the oldest, preferring streams not kept for an heir.

Stream 0 also waits for a side stream's last kernel once JOIN_LAG kernels have run past it (a
join). Memory a side stream reads cannot be used again until a wait orders that read first, so
unjoined, side work (a weight gradient reading an activation) holds what it reads to the end of
the call, and a training step's peak is most of its forward's activations at once. Joined a few
kernels behind, the side work has usually finished by the time stream 0 waits for it.

A dependency on a kernel of another stream becomes a wait on the event recorded after that
kernel, unless it is already implied by an earlier wait (waits are transitive). The plan also
gives the happens-before relation (`before`), which the memory plan uses so that no stream
writes memory another stream may still read. Stream 0 is the program's own stream: every call
starts there (the other streams fork from it) and joins back into it at the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from glue.scheduler.kernel_ir import Kernel

MAX_STREAMS = 4
# Kernels stream 0 runs past a side stream's last kernel before it waits for it (see the module
# docstring). The GPT-2-width f32 step planned 1.76 GB on four streams unjoined, 1.49 GB joined
# 4 kernels behind (1.12 on one stream), and ran as fast (benchmarks/RESULTS.md).
JOIN_LAG = 4


@dataclass(frozen=True)
class StreamPlan:
    """Per kernel (in program order): its stream, the kernels it depends on, and the kernels on
    other streams whose events it waits for. `clocks[k][s]` is the last kernel of stream s that
    happens before kernel k (-1: none; a vector clock): work on a stream runs in order, so what
    happens before k is, on each stream, everything up to that kernel."""

    streams: tuple[int, ...]
    deps: tuple[tuple[int, ...], ...]
    waits: tuple[tuple[int, ...], ...]
    clocks: tuple[tuple[int, ...], ...]

    @property
    def n_streams(self) -> int:
        return max(self.streams, default=0) + 1

    @property
    def recorded(self) -> frozenset[int]:
        """Kernels after which an event must be recorded (some other stream waits for them)."""
        return frozenset(j for ws in self.waits for j in ws)

    def before(self, i: int, j: int) -> bool:
        """Whether kernel i finishes before kernel j starts, on every run."""
        clock = self.clocks[j]
        s = self.streams[i]
        return s < len(clock) and i <= clock[s]

    def tails(self) -> dict[int, int]:
        """stream -> its last kernel: what stream 0 waits for at the end of a call."""
        return {s: k for k, s in enumerate(self.streams)}

    def text(self, kernels: Sequence[Kernel]) -> str:
        lines = [f"{self.n_streams} stream(s); {sum(map(len, self.waits))} cross-stream wait(s)"]
        for k, kernel in enumerate(kernels):
            deps = f" after {', '.join(f'k{d}' for d in self.deps[k])}" if self.deps[k] else ""
            waits = f"; waits for {', '.join(f'k{w}@s{self.streams[w]}' for w in self.waits[k])}" \
                if self.waits[k] else ""
            lines.append(f"  s{self.streams[k]} k{k} {kernel.name} ({kernel.kind}){deps}{waits}")
        joins = [f"s{s} after k{k}" for s, k in sorted(self.tails().items()) if s]
        if joins:
            lines.append(f"  s0 joins {', '.join(joins)}")
        return "\n".join(lines)


def kernel_deps(kernels: Sequence[Kernel]) -> list[tuple[int, ...]]:
    """For each kernel, the earlier kernels that produce its inputs."""
    producer: dict[int, int] = {}
    deps = []
    for k, kernel in enumerate(kernels):
        deps.append(tuple(sorted({producer[b.value_id] for b in kernel.inputs if b.value_id in producer})))
        for b in kernel.outputs:
            producer[b.value_id] = k
    return deps


def heirs(deps: Sequence[tuple[int, ...]]) -> dict[int, int]:
    """kernel -> the consumer that continues its stream: the one with the most kernels still
    to run after it (the earliest on a tie)."""
    height = [1] * len(deps)  # kernels on the longest chain from each kernel to the end
    for k in reversed(range(len(deps))):
        for d in deps[k]:
            height[d] = max(height[d], height[k] + 1)
    heir: dict[int, int] = {}
    for k, ds in enumerate(deps):
        for d in ds:
            if d not in heir or height[k] > height[heir[d]]:
                heir[d] = k
    return heir


def _join(clock: list[int], other: Sequence[int]) -> None:
    """clock := the latest of both, stream by stream."""
    for s, k in enumerate(other):
        if k > clock[s]:
            clock[s] = k


def plan_streams(kernels: Sequence[Kernel], max_streams: int = MAX_STREAMS) -> StreamPlan:
    """The stream plan of `kernels` (in program order) on at most `max_streams` streams."""
    deps = kernel_deps(kernels)
    heir = heirs(deps)
    streams: list[int] = []
    waits: list[tuple[int, ...]] = []
    clocks: list[tuple[int, ...]] = []
    tail: list[int] = []  # stream -> its last kernel so far
    width = max(1, min(max_streams, len(kernels)))

    def through(d: int) -> list[int]:
        """What happens before kernel d, and d itself."""
        clock = list(clocks[d])
        clock[streams[d]] = d
        return clock

    for k, ds in enumerate(deps):
        stream = next((streams[d] for d in reversed(ds) if tail[streams[d]] == d and heir[d] == k), None)
        if stream is None:
            needed = [-1] * width
            for d in ds:
                _join(needed, through(d))
            # a stream whose last kernel awaits its heir is kept for that heir
            reserved = [heir.get(t, -1) > k for t in tail]
            stream = next((s for s, t in enumerate(tail) if t <= needed[s] and not reserved[s]), None)
            if stream is None and len(tail) < max_streams:
                stream = len(tail)
                tail.append(-1)
                reserved.append(False)
            if stream is None:  # every stream busy with unrelated work: the one idle longest
                stream = min(range(len(tail)), key=lambda s: (reserved[s], tail[s]))
        known = through(tail[stream]) if tail[stream] >= 0 else [-1] * width
        mine = []
        for d in sorted(ds, reverse=True):  # a later producer's wait may cover earlier ones
            if d > known[streams[d]]:
                mine.append(d)
                _join(known, through(d))
        if stream == 0:
            for s, t in enumerate(tail):
                if s and t > known[s] and k - t >= JOIN_LAG:
                    mine.append(t)
                    _join(known, through(t))
        streams.append(stream)
        waits.append(tuple(sorted(mine)))
        clocks.append(tuple(known))
        tail[stream] = k
    return StreamPlan(tuple(streams), tuple(deps), tuple(waits), tuple(clocks))
