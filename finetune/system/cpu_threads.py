"""A CPU run's torch threads, matched to the cores other processes leave free.

Torch's intra-op threads wait for each other at the end of every operation. When other processes take
the cores, one descheduled thread holds all the others up: on 2 cores with two busy processes, a
micro-batch of the demo model that took 0.25 s took 11 s with torch's default 2 threads, and that one
micro-batch pushed a run 7% past its deadline (bench/bench_deadline.py, busy case; with one thread the
same run ended inside it). So a CPU run watches how much CPU the rest of the machine uses, a few seconds
at a time, and trains on as many threads as cores are left (at least one, never more than it started
with): fewer as soon as the machine gets busy, more again once it has been quiet for two looks in a row.

Only the CPUs this process may run on are counted (os.sched_getaffinity: a container's cpuset). Imports
only the standard library and psutil; torch's thread count is passed in as two functions, so tests drive
it with recorded figures.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class CpuUse:
    """Cumulative CPU seconds at one moment: all of this process's CPUs busy, this process (and its live
    children, e.g. DataLoader workers) alone."""

    at_s: float
    busy_s: float
    own_s: float


def read_cpu_use(cpus: list[int]) -> CpuUse:
    """Now, from /proc through psutil. Busy is everything but idle and I/O wait (steal counts: a CPU the
    hypervisor gave to another machine is not free)."""
    import psutil

    per_cpu = psutil.cpu_times(percpu=True)
    busy = sum(
        t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)
        for i, t in enumerate(per_cpu)
        if i in cpus
    )
    process = psutil.Process()
    own = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.Error:  # a child that ended between the listing and the reading
            continue
        own += times.user + times.system
    return CpuUse(time.monotonic(), busy, own)


def threads_for(cores: int, others_cores: float, most: int) -> int:
    """Threads to train on: the cores others leave free, rounded, between 1 and `most`."""
    return max(1, min(most, int(cores - others_cores + 0.5)))


LOOK_BEFORE_S = 0.5  # before an evaluation, a look this long after the last one still tells (50 ticks a core)


class CpuThreads:
    """Call `adjust()` between pieces of work (each micro-batch): at most every `every_s` it compares the
    machine's CPU use with this process's since the last look and sets the thread count. Before a piece of
    work that cannot look while it runs (an evaluation), `adjust(LOOK_BEFORE_S)` looks sooner."""

    def __init__(
        self,
        logger,
        get_threads: Callable[[], int],
        set_threads: Callable[[int], None],
        every_s: float = 3.0,
        cpus: list[int] | None = None,
        read: Callable[[list[int]], CpuUse] = read_cpu_use,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.logger, self.get_threads, self.set_threads = logger, get_threads, set_threads
        self.every_s, self.read, self.clock = every_s, read, clock  # `clock`: the one `read` stamps its looks with
        self.cpus = cpus if cpus is not None else sorted(os.sched_getaffinity(0))
        self.most = get_threads()  # what torch started with (OMP_NUM_THREADS, or its default)
        self.last: CpuUse | None = None
        self.wants_more = 0  # looks in a row that found more cores free than threads in use
        self.changes = 0

    @property
    def active(self) -> bool:
        return self.most > 1

    def adjust(self, every_s: float | None = None) -> None:
        """A look, if the last was at least `every_s` ago (the one set by default), and the threads set from it.
        A final evaluation started 3 s after two processes took the cores, before the next look, ran its first
        clip on 2 threads 39 times slower than planned, and a 72 s run ended 0.07 s late."""
        if not self.active:
            return
        wait_s = self.every_s if every_s is None else every_s
        if self.last is not None and self.clock() - self.last.at_s < wait_s:
            return
        now = self.read(self.cpus)
        last, self.last = self.last, now
        if last is None or now.at_s <= last.at_s:
            return
        wall = now.at_s - last.at_s
        others = max(0.0, (now.busy_s - last.busy_s) - (now.own_s - last.own_s)) / wall
        self.decide(threads_for(len(self.cpus), others, self.most), others)

    def decide(self, wanted: int, others_cores: float) -> None:
        current = self.get_threads()
        if wanted < current:
            self.wants_more = 0
            self.change(current, wanted, others_cores)
        elif wanted > current:
            self.wants_more += 1
            if self.wants_more >= 2:
                self.wants_more = 0
                self.change(current, wanted, others_cores)
        else:
            self.wants_more = 0

    def change(self, current: int, wanted: int, others_cores: float) -> None:
        self.set_threads(wanted)
        self.changes += 1
        why = "the machine got busy" if wanted < current else "cores are free again"
        self.logger.info(
            f"cpu: {why} (other processes use {others_cores:.1f} of {len(self.cpus)} cores): "
            f"training on {wanted} thread{'s' if wanted > 1 else ''}, was {current}"
        )
