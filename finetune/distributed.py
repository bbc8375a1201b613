"""Who this process is in a (future) data-parallel run, and the decisions all processes must share.

The loop is written against this small interface so that a torchrun launch (one process per GPU) only
changes what is behind it: the sampler shards batches by `rank`, only the main process logs and saves,
and the stop decision is taken jointly (`any`: if one process must stop, all do, so the deadline is one
shared deadline). Today every run is a single process; a torchrun launch is refused with a clear message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def any(self, flag: bool) -> bool:
        """True on every process when it is True on any (single process: the flag itself)."""
        return flag


def from_environment() -> Distributed:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        raise SystemExit("data-parallel training (torchrun with several processes) is not built yet: "
                         "run train_vits.py as a single process")
    return Distributed()
