"""PyTorch's CUDA caching allocator, replayed over a traced step's allocations.

The reserved memory of a training step (``torch.cuda.max_memory_reserved()``) is what the
caching allocator holds in segments obtained from ``cudaMalloc``; it exceeds the allocated
peak by how the step's blocks fragment those segments. The rules below are the default
configuration of ``c10/cuda/CUDACachingAllocator.cpp`` (``PYTORCH_CUDA_ALLOC_CONF`` unset,
one stream):

- a request is rounded up to a multiple of 512 bytes (``round_size``, ``kMinBlockSize``);
- requests of at most 1 MiB (``kSmallSize``) come from the small pool, whose segments are
  2 MiB (``kSmallBuffer``); larger ones from the large pool, whose new segment is 20 MiB
  (``kLargeBuffer``) below 10 MiB (``kMinLargeAlloc``) and the request rounded up to 2 MiB
  (``kRoundLarge``) from there (``get_allocation_size``);
- a request takes the smallest free block of its pool that holds it (``get_free_block``,
  best fit over blocks ordered by size then address), and a new segment only when none does;
- the block is split when the remainder is at least 512 bytes (small pool) or more than
  1 MiB (large pool) (``should_split``); the remainder stays free in the same segment;
- a freed block merges with free neighbours of its own segment (``try_merge_blocks``), never
  across segments; segments are not returned (no ``empty_cache``).

``allocated`` counts blocks as the allocator does (rounded, with any unsplit remainder),
which is what ``torch.cuda.max_memory_allocated()`` reports.

Pure Python, no torch: :func:`gpuplan.trace.run.trace_memory` feeds it each storage the
traced step creates and frees.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools

MIN_BLOCK = 512
"""``kMinBlockSize``: every request is rounded up to a multiple of this."""
SMALL_SIZE = 1 << 20
"""``kSmallSize``: requests up to this size use the small pool."""
SMALL_BUFFER = 2 << 20
"""``kSmallBuffer``: a small-pool segment."""
LARGE_BUFFER = 20 << 20
"""``kLargeBuffer``: the segment a large-pool request below :data:`MIN_LARGE_ALLOC` gets."""
MIN_LARGE_ALLOC = 10 << 20
"""``kMinLargeAlloc``: from this size a segment is the request rounded to :data:`ROUND_LARGE`."""
ROUND_LARGE = 2 << 20
"""``kRoundLarge``."""


def round_size(nbytes: int) -> int:
    """A request's size as the allocator serves it (``round_size``)."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * -(-nbytes // MIN_BLOCK)


def segment_size(size: int) -> int:
    """Bytes of the segment a rounded request that fits no free block gets
    (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


@dataclasses.dataclass(eq=False, slots=True)
class Block:
    """A piece of a segment, free or handed out."""

    size: int
    addr: int
    small: bool
    free: bool = True
    prev: Block | None = None
    next: Block | None = None

    def key(self) -> tuple[int, int]:
        """The pool order: size, then address (``BlockComparatorSize``)."""
        return (self.size, self.addr)


class CachingAllocator:
    """The caching allocator's bookkeeping: blocks, segments and the two peaks."""

    def __init__(self) -> None:
        self._pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._free: dict[tuple[int, int], Block] = {}
        self._next_addr = itertools.count(0)
        self.reserved = 0
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0
        self.segments = 0

    def _insert(self, block: Block) -> None:
        block.free = True
        bisect.insort(self._pools[block.small], block.key())
        self._free[block.key()] = block

    def _remove(self, block: Block) -> None:
        pool = self._pools[block.small]
        del pool[bisect.bisect_left(pool, block.key())]
        del self._free[block.key()]

    def malloc(self, nbytes: int) -> Block:
        """Serve a request of ``nbytes`` and return its block."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = self._free[pool[i]]
            self._remove(block)
        else:
            seg = segment_size(size)
            # segments never touch: a block merges only within its own segment
            block = Block(size=seg, addr=next(self._next_addr) << 48, small=small)
            self.reserved += seg
            self.segments += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = block.size - size
        split = rest >= MIN_BLOCK if small else rest > SMALL_SIZE
        if split:
            tail = Block(
                size=rest, addr=block.addr + size, small=small, prev=block, next=block.next
            )
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert(tail)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: Block) -> None:
        """Return a block; it merges with its free neighbours in the segment."""
        self.allocated -= block.size
        for side in (block.prev, block.next):
            if side is None or not side.free:
                continue
            self._remove(side)
            first, second = (side, block) if side is block.prev else (block, side)
            first.size += second.size
            first.next = second.next
            if second.next is not None:
                second.next.prev = first
            block = first
        self._insert(block)

    def reset_peaks(self) -> None:
        """Start the peaks again from now (``torch.cuda.reset_peak_memory_stats``)."""
        self.peak_reserved = self.reserved
        self.peak_allocated = self.allocated
