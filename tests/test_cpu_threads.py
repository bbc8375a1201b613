"""A CPU run's thread count follows the cores other processes leave free (finetune/system/cpu_threads.py):
the rule on recorded CPU figures, and the readings on this machine."""

import logging
import os

from finetune.system.cpu_threads import CpuThreads, CpuUse, read_cpu_use, threads_for


def test_threads_for_rounds_the_free_cores_between_one_and_the_start():
    assert threads_for(cores=2, others_cores=0.05, most=2) == 2
    assert threads_for(cores=2, others_cores=1.0, most=2) == 1  # one busy process: one core left
    assert threads_for(cores=2, others_cores=2.0, most=2) == 1  # never fewer than one
    assert threads_for(cores=16, others_cores=0.0, most=8) == 8  # never more than torch started with
    assert threads_for(cores=16, others_cores=5.4, most=16) == 11


class Recorded:
    """CPU figures as a machine would give them: each look, `others` and `own` cores busy for 3 s."""

    def __init__(self, cpus: int):
        self.at, self.busy, self.own, self.cpus = 0.0, 0.0, 0.0, cpus
        self.next = (0.0, 0.0)

    def __call__(self, cpus):
        others, own = self.next
        self.at += 3.0
        self.busy += 3.0 * min(self.cpus, others + own)
        self.own += 3.0 * own
        return CpuUse(self.at, self.busy, self.own)


def threads_following(looks: list[tuple[float, float]], start: int = 2, cpus: int = 2) -> list[int]:
    threads = {"n": start}
    recorded = Recorded(cpus)
    control = CpuThreads(
        logging.getLogger("test"),
        lambda: threads["n"],
        lambda n: threads.update(n=n),
        every_s=0.0,
        cpus=list(range(cpus)),
        read=recorded,
    )
    seen = []
    for look in looks:
        recorded.next = look
        control.adjust()
        seen.append(threads["n"])
    return seen


def test_fewer_threads_as_soon_as_the_machine_gets_busy_more_after_two_quiet_looks(caplog):
    idle, busy = (0.05, 1.9), (1.5, 0.5)  # (others' cores, own cores)
    with caplog.at_level(logging.INFO):
        seen = threads_following([idle, idle, busy, busy, idle, idle, idle])
    # The first look only starts the count; the third sees two busy processes and drops to one thread
    # at once; the machine is quiet again from the fifth, and two quiet looks bring the second thread back.
    assert seen == [2, 2, 1, 1, 1, 2, 2]
    lines = [r.getMessage() for r in caplog.records]
    assert any("the machine got busy" in line and "training on 1 thread, was 2" in line for line in lines)
    assert any("cores are free again" in line and "training on 2 threads, was 1" in line for line in lines)


def test_one_busy_look_between_quiet_ones_does_not_bring_threads_back():
    idle, busy = (0.0, 1.0), (1.2, 0.8)
    assert threads_following([idle, busy, idle, busy, idle, idle]) == [2, 1, 1, 1, 1, 2]


def test_a_run_started_on_one_thread_is_left_alone():
    control = CpuThreads(
        logging.getLogger("test"),
        lambda: 1,
        lambda n: (_ for _ in ()).throw(AssertionError(n)),
        every_s=0.0,
        cpus=[0, 1],
        read=Recorded(2),
    )
    assert not control.active
    for _ in range(3):
        control.adjust()
    assert control.changes == 0


def test_the_readings_on_this_machine_count_this_process():
    cpus = sorted(os.sched_getaffinity(0))
    before = read_cpu_use(cpus)
    total = 0
    for i in range(3_000_000):  # about a quarter of a second of CPU
        total += i
    after = read_cpu_use(cpus)
    assert after.at_s > before.at_s
    assert after.own_s - before.own_s >= 0.05
    assert after.busy_s - before.busy_s >= 0.05


def test_a_look_before_an_evaluation_comes_sooner_than_the_usual_ones():
    """Between micro-batches the cores are looked at every 3 s; an evaluation runs on the threads it starts with,
    so before one a look comes from LOOK_BEFORE_S after the last: two processes that took the cores a second ago
    are seen before it starts (a final evaluation started before the next usual look ran its first clip on 2
    threads 39 times slower than planned, and a 72 s run ended 0.07 s late)."""
    from finetune.system.cpu_threads import LOOK_BEFORE_S

    now, threads = [0.0], {"n": 2}
    readings = iter([CpuUse(0.0, 0.0, 0.0), CpuUse(1.0, 2.0, 0.4)])  # the second: others 1.6 cores, this 0.4
    control = CpuThreads(
        logging.getLogger("test"),
        lambda: threads["n"],
        lambda n: threads.update(n=n),
        every_s=3.0,
        cpus=[0, 1],
        read=lambda cpus: next(readings),
        clock=lambda: now[0],
    )
    control.adjust()  # the first look only starts the count
    now[0] = 1.0
    control.adjust()  # between micro-batches: 1 s after the last look is too soon
    assert threads["n"] == 2
    control.adjust(LOOK_BEFORE_S)  # before an evaluation
    assert threads["n"] == 1
