"""hcq/graph.py: arena planning and relocatable queue templates."""
from __future__ import annotations

import random

import pytest

from rawgrad.hcq.graph import ARENA_ALIGNMENT, plan_arena


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def test_chain_reuses_memory() -> None:
    n = 1000
    offsets, total = plan_arena([64] * n, [(i, i + 1) for i in range(n)])
    assert total == 2 * ARENA_ALIGNMENT
    assert len(set(offsets)) == 2


@pytest.mark.parametrize("seed", range(5))
def test_live_buffers_never_share_memory(seed: int) -> None:
    r = random.Random(seed)
    sizes, lifetimes = [], []
    for _ in range(200):
        first = r.randrange(100)
        sizes.append(r.choice([0, 1, 100, 256, 1000, 5000]))
        lifetimes.append((first, first + r.randrange(10)))
    offsets, total = plan_arena(sizes, lifetimes)
    assert total < sum(max(s, 1) + ARENA_ALIGNMENT for s in sizes)
    for i in range(len(sizes)):
        assert offsets[i] % ARENA_ALIGNMENT == 0 and offsets[i] + sizes[i] <= total
        for j in range(i):
            if overlaps(lifetimes[i], lifetimes[j]):
                mi = (offsets[i], offsets[i] + max(sizes[i], 1))
                mj = (offsets[j], offsets[j] + max(sizes[j], 1))
                assert mi[1] <= mj[0] or mj[1] <= mi[0], (i, j)


def test_bad_lifetime() -> None:
    with pytest.raises(ValueError, match="ends before it starts"):
        plan_arena([4], [(3, 2)])
