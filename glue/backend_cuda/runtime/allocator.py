"""A caching allocator for device memory: freed blocks are kept and reused instead of going back
to the driver (cuMemFree synchronises the device, and both calls cost far more than a cache hit).

Requests are rounded up to a size class (multiples of 512 bytes up to 1 MiB, then eight classes
per power of two, so at most 1/8 is wasted) and a freed block is cached under (stream, class).
Reuse is safe without any host wait because a block goes back to the stream it was used on, and
work on one stream runs in order. A block another stream also used (`record_use`) waits in a
pending list until events recorded on those streams have completed. A request with nothing cached
on its stream takes a block cached on another stream and makes its stream wait, on the device,
for the work queued there so far. Those events are recorded and waited for only under the
context's enqueue lock and never while a graph is being captured (a capture takes in whatever
lands on its streams, from any thread); meanwhile such a block stays uncached and requests
take no block from another stream.

On out-of-memory the allocator waits for the device, returns its whole cache to the driver and
retries once; if that fails it raises `CudaOutOfMemoryError` reporting what glue holds.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from glue.backend_cuda.runtime import driver as drv

if TYPE_CHECKING:
    from glue.backend_cuda.runtime.context import Context
    from glue.backend_cuda.runtime.stream import Event, Stream

_SMALL = 1 << 20


def size_class(nbytes: int) -> int:
    """The number of bytes actually reserved for a request of `nbytes`."""
    if nbytes <= _SMALL:
        return max(512, (nbytes + 511) & ~511)
    step = 1 << (nbytes.bit_length() - 4)
    return (nbytes + step - 1) & ~(step - 1)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Block:
    """A piece of device memory: `size` bytes reserved (a size class) for `requested` asked."""

    __slots__ = ("ptr", "size", "requested", "stream", "other_streams")

    def __init__(self, ptr: int, size: int, requested: int, stream: Stream):
        self.ptr, self.size, self.requested, self.stream = ptr, size, requested, stream
        self.other_streams: set[Stream] = set()


@dataclass(frozen=True)
class AllocatorStats:
    bytes_in_use: int         # reserved for live blocks (size classes)
    bytes_requested: int      # what the owners of live blocks asked for
    bytes_cached: int         # free blocks kept for reuse, pending ones included
    bytes_reserved: int       # in use + cached: what glue holds from the driver
    peak_bytes_in_use: int
    peak_bytes_reserved: int
    live_blocks: int
    cached_blocks: int
    hits: int                 # requests served from the cache
    misses: int               # requests that went to the driver
    driver_allocs: int
    driver_frees: int
    oom_retries: int          # times the cache was emptied to satisfy a request

    def __str__(self) -> str:
        return ", ".join(f"{f.name}={format_bytes(v) if 'bytes' in f.name else v}"
                         for f in fields(self) for v in [getattr(self, f.name)])


class CachingAllocator:
    """Device memory for one context, cached per (stream, size class)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._lock = threading.Lock()
        self._free: dict[tuple[Stream, int], list[Block]] = {}
        self._pending: list[tuple[Block, list[Event]]] = []
        # Frees arrive from finalizers, which may run inside a locked section; they only append
        # here (atomic under the GIL) and the next locked operation takes them in.
        self._released: list[Block] = []
        self._live: dict[int, Block] = {}
        self._in_use = self._requested = self._cached = 0
        self._peak_in_use = self._peak_reserved = 0
        self._counts = dict.fromkeys(("hits", "misses", "driver_allocs", "driver_frees", "oom_retries"), 0)

    def allocate(self, nbytes: int, stream: Stream) -> Block:
        """A block of at least `nbytes` usable by work queued on `stream` from now on."""
        size = size_class(nbytes)
        with self._lock:
            if self._released:
                self._take_released()
            block = self._from_cache(size, stream)
            if block is None:
                self._counts["misses"] += 1
                block = Block(self._driver_alloc(size, nbytes), size, nbytes, stream)
                self._peak_reserved = max(self._peak_reserved, self._in_use + size + self._cached)
            else:
                self._counts["hits"] += 1
                self._cached -= size
                block.requested, block.stream = nbytes, stream
            self._live[block.ptr] = block
            self._in_use += size
            self._requested += nbytes
            if self._in_use > self._peak_in_use:
                self._peak_in_use = self._in_use
            return block

    def free(self, block: Block) -> None:
        """Give a block back; work already queued that uses it may still be running."""
        self._released.append(block)

    @staticmethod
    def record_use(block: Block, stream: Stream) -> None:
        """Note that work on `stream` (not the block's own) uses the block, so it is not reused
        before that work has finished."""
        if stream is not block.stream:
            block.other_streams.add(stream)

    def empty_cache(self) -> int:
        """Wait for the device and return every cached block to the driver; bytes released."""
        with self._lock:
            self._take_released()
            return self._release_cache()

    def stats(self) -> AllocatorStats:
        with self._lock:
            self._take_released()
            return AllocatorStats(
                self._in_use, self._requested, self._cached, self._in_use + self._cached,
                self._peak_in_use, self._peak_reserved, len(self._live),
                sum(map(len, self._free.values())) + len(self._pending), **self._counts)

    def reset_peak_stats(self) -> None:
        """Start the peaks over from what is in use and reserved now (as
        `torch.cuda.reset_peak_memory_stats`): the peak of one phase of a program."""
        with self._lock:
            self._take_released()
            self._peak_in_use = self._in_use
            self._peak_reserved = self._in_use + self._cached

    def describe(self) -> str:
        """What glue holds on the device, for error messages."""
        largest = sorted((b.size for b in self._live.values()), reverse=True)[:5]
        return (f"glue holds {len(self._live)} live buffers using {format_bytes(self._in_use)} "
                f"(peak {format_bytes(self._peak_in_use)}; largest: "
                f"{', '.join(map(format_bytes, largest)) or 'none'}) and caches "
                f"{format_bytes(self._cached)}")

    # Everything below runs with the lock held.

    def _streams_free(self) -> bool:
        """Take the context's enqueue lock if an event may be recorded on, or waited for by, its
        streams now: not while a graph is being captured (by another thread, the capture would
        take the event in; by this one, it would become a node of the graph). True: the caller
        releases the lock."""
        lock = self.ctx.enqueue_lock
        if not lock.acquire(blocking=False):
            return False
        if self.ctx.capturing:
            lock.release()
            return False
        return True

    def _take_released(self) -> None:
        held: bool | None = None  # whether this call holds the enqueue lock (None: not tried)
        kept: list[Block] = []  # blocks other streams used, while no event can be recorded
        try:
            while self._released:
                block = self._released.pop()
                if block.other_streams:
                    if held is None:
                        held = self._streams_free()
                    if not held:
                        kept.append(block)
                        continue
                del self._live[block.ptr]
                self._in_use -= block.size
                self._requested -= block.requested
                self._cached += block.size
                if block.other_streams:
                    self._pending.append((block, [s.record() for s in block.other_streams]))
                    block.other_streams = set()
                else:
                    self._free.setdefault((block.stream, block.size), []).append(block)
        finally:
            if held:
                self.ctx.enqueue_lock.release()
            self._released.extend(kept)

    def _from_cache(self, size: int, stream: Stream) -> Block | None:
        blocks = self._free.get((stream, size))
        if blocks:
            return blocks.pop()
        if self._pending and self._collect_pending():
            return self._from_cache(size, stream)
        for (other, other_size), blocks in self._free.items():
            if other_size == size and blocks and self._streams_free():
                try:
                    stream.wait(other.record())
                finally:
                    self.ctx.enqueue_lock.release()
                return blocks.pop()
        return None

    def _collect_pending(self) -> bool:
        """Move pending blocks whose other streams are done into the free lists."""
        done = [(b, evs) for b, evs in self._pending if all(e.query() for e in evs)]
        for item in done:
            self._pending.remove(item)
            self._free.setdefault((item[0].stream, item[0].size), []).append(item[0])
        return bool(done)

    def _driver_alloc(self, size: int, requested: int) -> int:
        driver = drv.load()
        self.ctx.make_current()
        err, ptr = driver.cuMemAlloc(size)
        if err and err.name == "CUDA_ERROR_OUT_OF_MEMORY" and self._cached:
            self._counts["oom_retries"] += 1
            self._release_cache()
            err, ptr = driver.cuMemAlloc(size)
        if err:
            free, total = self.ctx.memory_info()
            raise drv.error_for(
                "cuMemAlloc", err, detail=f"asked for {format_bytes(requested)} on {self.ctx.device} "
                f"({format_bytes(free)} of {format_bytes(total)} free); {self.describe()}")
        self._counts["driver_allocs"] += 1
        return int(ptr)

    def _release_cache(self) -> int:
        self.ctx.synchronize()
        blocks = [b for bs in self._free.values() for b in bs] + [b for b, _ in self._pending]
        for block in blocks:
            drv.call(drv.load().cuMemFree, block.ptr)
        self._counts["driver_frees"] += len(blocks)
        self._free.clear()
        self._pending.clear()
        released, self._cached = self._cached, 0
        return released
