"""The sparse id counts a collective step carries in its dense all-reduce: every rank
writes its counts as two float32 halves into its own slots, the others' slots are zero,
and the float32 sum over the ranks must give every count back exactly."""

import numpy as np
import pytest

from pyfleet.distributed.collective_backend import count_halves, counts_of_halves

BIG = [0, 1, 2 ** 22 - 1, 2 ** 22, 2 ** 24 + 1, 2 ** 40 + 12345, 2 ** 46 - 1]


def test_counts_survive_the_float32_sum_over_the_ranks():
    ranks, tables = 3, len(BIG)
    rng = np.random.default_rng(0)
    counts = np.array([BIG, rng.integers(0, 2 ** 46, tables), BIG[::-1]], dtype=np.int64)
    total = np.zeros((2, ranks, tables), dtype=np.float32)
    for r in range(ranks):          # what each rank sends: its slots filled, the rest 0
        mine = np.zeros((2, ranks, tables), dtype=np.float32)
        count_halves(counts[r], mine[:, r])
        total += mine               # the all-reduce's float32 sum
    np.testing.assert_array_equal(counts_of_halves(total), counts)
    # (one float32 a count would not do: 2**24 + 1 is not a float32)
    assert int(np.float32(2 ** 24 + 1)) != 2 ** 24 + 1


@pytest.mark.parametrize("bad", [-1, 2 ** 46])
def test_a_count_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="sparse id counts must be in"):
        count_halves([3, bad], np.zeros((2, 2), dtype=np.float32))
