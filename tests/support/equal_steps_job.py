"""``pyfleet.trainer.mpi.equal_steps`` on the ranks of a real ``mpirun``.

    python -m support.equal_steps_job OUT

Rank r has ``3 + 2*r`` batches (the integers ``100*r + i``). Pass 1 takes every
batch ``equal_steps`` hands out; pass 2 stops after the first (closing the
generator while its next count is in flight), then every rank does one more
collective to show none is left half-done. Writes ``OUT/rank<r>.json``.
"""

import json
import os
import sys

import numpy as np

from pyfleet.distributed.mpi_group import MPIGroup
from pyfleet.trainer.mpi import equal_steps


def main(out):
    group = MPIGroup()
    mine = [100 * group.rank + i for i in range(3 + 2 * group.rank)]
    full = list(equal_steps(mine, group))
    early = []
    for b in equal_steps(mine, group):
        early.append(b)
        break
    after = group.allreduce_sum(np.array([group.rank + 1], dtype=np.int64), "a check")
    with open(os.path.join(out, f"rank{group.rank}.json"), "w") as f:
        json.dump({"full": full, "early": early, "after": int(after[0])}, f)


if __name__ == "__main__":
    main(sys.argv[1])
