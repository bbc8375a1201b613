"""A micro-batch given up part-way when the deadline comes before it ends.

The deadline is asked before each micro-batch (finetune/training/window.py), at the speed the last one ran.
A machine that gets busy while one runs is not seen there: on 2 cores, a 12 s micro-batch of a 72 s run took
40.7 s once two other processes started under it, and the run ended 8% past its budget. So a micro-batch that
could end too late at ten times its usual cost (AT_RISK), or that starts within WATCHED_S of the time the final
save needs, is watched while it runs: every module's forward and
every trained weight's gradient asks the clock, and once the time the final save needs has come, the
micro-batch is given up (MicroBatchLate) and the gradients go back to what the window's earlier micro-batches
had made (kept on the CPU before it started). What the window had run is then applied as its last step.

Only a micro-batch near the deadline is watched (the copy of the gradients costs a model's size in memory and
a copy's time), and only in a run of one process: processes of a data-parallel run must agree on how many
micro-batches each ran, and a watch that fires on one and not another would leave them apart.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

AT_RISK = 10.0  # watched when the time left before the final save is under this many times the micro-batch's cost
# ... or under this many seconds, whatever the micro-batch's cost: on 2 cores, the demo's 0.27 s micro-batch took
# 6.7 s when two busy processes started under it before the run could give a thread up (torch's threads wait for
# each other; cpu_threads.py looks every 3 s), and a 72 s run ended 0.3 s into its final save's time (0.02 s late).
WATCHED_S = 15.0


class MicroBatchLate(Exception):
    """The micro-batch under way was given up: the time the final save needs had come."""


@contextmanager
def given_up_when_late(is_late: Callable[[], bool] | None, modules: list[torch.nn.Module]) -> Iterator[None]:
    """Runs the block (one micro-batch's forward and backward into `modules`' gradients) watched by `is_late`
    (None: not watched): once it says True, the next module called or gradient made raises MicroBatchLate
    and the gradients of `modules` are put back as they were before the block."""
    if is_late is None:
        yield
        return
    params = [p for module in modules for p in module.parameters() if p.requires_grad]
    kept = [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]

    def check(*_) -> None:
        if is_late():
            raise MicroBatchLate

    handles = [torch.nn.modules.module.register_module_forward_pre_hook(check)]
    handles += [p.register_hook(check) for p in params]  # returns None: the gradient is left as it is
    try:
        yield
    except MicroBatchLate:
        for param, grad in zip(params, kept):
            param.grad = None if grad is None else grad.to(param.device)
        raise
    finally:
        for handle in handles:
            handle.remove()
