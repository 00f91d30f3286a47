"""OutputSets, the reuse of a program's output buffers by reference count (no GPU needed: the
allocator and stream are stand-ins that record what happens to each block)."""
import gc

import numpy as np
from hypothesis import given, settings, strategies as st

from glue.backend_cuda.runtime.device_array import OutputSets
from glue.ir import dtypes as dt

F32 = dt.from_numpy(np.dtype("float32"))


class _Stream:
    pass


class _Block:
    def __init__(self, ptr: int, stream: _Stream):
        self.ptr, self.stream, self.other_streams = ptr, stream, set()


class _Allocator:
    """Hands out numbered blocks and records which were freed (each must be freed once)."""

    def __init__(self):
        self.live: dict[int, _Block] = {}
        self.freed: list[int] = []
        self.count = 0

    def allocate(self, nbytes: int, stream: _Stream) -> _Block:
        self.count += 1
        block = self.live[self.count << 20] = _Block(self.count << 20, stream)
        return block

    def free(self, block: _Block) -> None:
        assert block.ptr in self.live, "a block freed twice"
        del self.live[block.ptr]
        self.freed.append(block.ptr)


LAYOUT = [((4,), F32, 16, 0), ((2, 3), F32, 24, 256)]


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sampled_from(["take", "drop", "drop_one", "other_stream"]), st.integers(0, 9)),
                max_size=60))
def test_a_set_goes_out_again_only_when_nothing_else_holds_it(ops):
    allocator, stream, released = _Allocator(), _Stream(), []
    sets = OutputSets(allocator, LAYOUT, 512, stream, lambda: released.append(1))
    held: list[list] = []  # what "the user" keeps: some buffers of some calls' outputs
    for op, k in ops:
        if op == "take":
            outputs = sets.take()
            # every set that left (let go, or freed after another stream used it) was announced
            assert len(released) == allocator.count - len(sets.sets)
            assert [b.shape for b in outputs] == [(4,), (2, 3)]
            assert outputs[1].ptr - outputs[0].ptr == 256
            # pending on the stream, which writes them next (and so is ordered after that write)
            assert all(b.written_on is stream and b.waited_on is stream and b.event is None for b in outputs)
            # nothing handed out is still held by anyone
            assert not any(b is o for kept in held for b in kept for o in outputs)
            held.append(list(outputs))
            del outputs
        elif op == "drop" and held:
            held.pop(k % len(held))
        elif op == "drop_one" and held and held[k % len(held)]:
            held[k % len(held)].pop()
        elif op == "other_stream" and held and held[k % len(held)]:
            held[k % len(held)][0]._block.other_streams.add(_Stream())
        in_sets = {id(s[0]._block) for s in sets.sets}
        assert len(in_sets) <= OutputSets.KEEP
    live_held = {b._block.ptr for kept in held for b in kept}
    assert live_held <= set(allocator.live)  # a held buffer's block is never freed
    sets.close()
    assert len(released) == allocator.count
    held.clear()
    gc.collect()
    assert not allocator.live, "every block goes back once its buffers are gone"


def test_a_loop_feeding_its_output_back_alternates_two_sets():
    allocator = _Allocator()
    sets = OutputSets(allocator, LAYOUT[:1], 512, _Stream())
    z = sets.take()[0]
    seen = set()
    for _ in range(10):
        z = sets.take()[0]
        seen.add(id(z))
    assert len(seen) == 2 and allocator.count == 2


def test_a_block_other_streams_used_goes_back_to_the_allocator():
    allocator = _Allocator()
    sets = OutputSets(allocator, LAYOUT[:1], 512, _Stream())
    first = sets.take()[0]
    first._block.other_streams.add(_Stream())
    ptr = first.ptr
    del first
    second = sets.take()[0]
    assert ptr in allocator.freed and second.ptr != ptr
