"""CUDA graphs: a program's launches captured once from its streams and replayed as one launch.

`capture(stream, enqueue)` runs `enqueue()` with `stream` in capture mode: the launches, copies
and event waits it queues (on `stream` and on any stream it forks from it through events) are
recorded instead of run, and come back as an instantiated `Graph`, whose `launch(stream)`
replays them all in a single driver call. The kernel parameters, buffer addresses included,
are fixed at capture; a caller whose addresses change captures again (see the executor).
Capture uses the thread-local mode, so other host threads may go on allocating and launching.
`replay_us` times what a callable queues, as the GEMM race and the step's profile do.
"""
from __future__ import annotations

import statistics
from typing import Callable

from glue.backend_cuda.runtime import driver as drv
from glue.backend_cuda.runtime.stream import Event, Stream


class Graph:
    """An instantiated CUDA graph (a `CUgraphExec`) and the graph it came from. `exec_handle`
    is the exec as the binding's `CUgraphExec`, made once: given an int, the binding makes one
    at every launch."""

    __slots__ = ("graph", "exec", "exec_handle", "nodes", "_launch")

    def __init__(self, graph: int, exec_: int, nodes: int):
        self.graph, self.exec, self.nodes = graph, exec_, nodes
        driver = drv.load()
        self.exec_handle = driver.CUgraphExec(exec_)
        self._launch = driver.cuGraphLaunch

    def launch(self, stream: Stream) -> None:
        """Queue one replay of the whole graph on `stream`."""
        err, = self._launch(self.exec_handle, stream.handle)
        if err:
            raise drv.error_for("cuGraphLaunch", err, detail=f"a graph of {self.nodes} nodes on {stream}")

    def __del__(self) -> None:
        try:
            driver = drv.load()
            driver.cuGraphExecDestroy(self.exec)
            driver.cuGraphDestroy(self.graph)
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass


def capture(stream: Stream, enqueue: Callable[[], None]) -> Graph:
    """The work `enqueue()` queues on `stream` (and on streams forked from it), as a graph."""
    driver = drv.load()
    stream.ctx.make_current()
    drv.call(driver.cuStreamBeginCapture, stream.handle,
             driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    stream.ctx.capturing = True
    try:
        enqueue()
    except BaseException:
        err, graph = driver.cuStreamEndCapture(stream.handle)  # leave the stream usable
        if not err and int(graph):
            driver.cuGraphDestroy(graph)
        raise
    finally:
        stream.ctx.capturing = False
    graph = drv.call(driver.cuStreamEndCapture, stream.handle)
    try:
        nodes = drv.call(driver.cuGraphGetNodes, graph, 0)[1]
        exec_ = drv.call(driver.cuGraphInstantiate, graph, 0)
    except BaseException:
        driver.cuGraphDestroy(graph)
        raise
    return Graph(int(graph), int(exec_), int(nodes))


def replay_us(stream: Stream, enqueue: Callable[[], None], repeats: int, warmup: int = 2, runs: int = 7) -> float:
    """Microseconds per run of the work `enqueue()` queues: run once (so that whatever it plans
    or allocates on first use happens outside the capture), captured `repeats` times back to
    back as one graph, replayed `warmup` + `runs` times; the median of the timed replays over
    `repeats`. Timed by events around direct launches, a small kernel's time would be the
    host's time to queue it, which a graph replay does not pay."""
    enqueue()
    graph = capture(stream, lambda: [enqueue() for _ in range(repeats)])
    samples = []
    for run in range(warmup + runs):
        start, end = Event(stream.ctx, timing=True), Event(stream.ctx, timing=True)
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        if run >= warmup:
            samples.append(start.elapsed_ms(end) * 1e3 / repeats)
    return statistics.median(samples)
