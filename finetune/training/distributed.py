"""Who this process is in a data-parallel run, and the decisions every process must share.

`torchrun --nproc_per_node=N train_vits.py ...` starts N processes (one per GPU; on CPU, N of them share
the cores). They form a process group (NCCL on GPUs, gloo on CPU, chosen from the device), each trains
on its own share of every epoch's batches, and their gradients are averaged once a window is done and
every process has agreed to apply it (finetune/training/step.py). Everything that must not differ between them goes
through here:

    any(flag)          a stop decision (deadline, signal, a non-finite loss): if one process must stop,
                       all do, on the same step, so the deadline is one shared deadline
    broadcast(obj)     the main process's plan, evaluation verdicts and measured costs, to all
    gather(obj)        every process's random state, for the checkpoint
    mean / sum         losses and samples/s for the progress line
    average_gradients  a window's gradients, once every process has decided to apply it
    broadcast_module   the main process's weights, to all, as a run starts

Only the main process (rank 0) logs, evaluates, saves and exports; the others wait for it at the next
shared decision. A single process (no torchrun) has an inactive group and every helper is the identity.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta

import torch


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # "nccl" or "gloo" once the group is up; None for a single process

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def _device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    def any_of(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag True on every process when it is True on any (one collective for all of them)."""
        if not self.active:
            return tuple(bool(f) for f in flags)
        values = torch.tensor([float(bool(f)) for f in flags], device=self._device())
        torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
        return tuple(bool(v) for v in values.tolist())

    def any(self, flag: bool) -> bool:
        return self.any_of(flag)[0]

    def broadcast(self, obj):
        """The main process's `obj`, on every process."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, device=self._device() if self.backend == "nccl" else None)
        return box[0]

    def gather(self, obj) -> list | None:
        """Every process's `obj`, in rank order, on the main process (None elsewhere)."""
        if not self.active:
            return [obj]
        boxes = [None] * self.world_size if self.is_main else None
        torch.distributed.gather_object(obj, boxes, dst=0)
        return boxes

    def mean(self, values: dict[str, float]) -> dict[str, float]:
        if not self.active or not values:
            return values
        tensor = torch.tensor(list(values.values()), dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(tensor)
        return dict(zip(values, (tensor / self.world_size).tolist()))

    def sum(self, value: float) -> float:
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """The main process's parameters and buffers, on every process (as a run starts)."""
        if not self.active:
            return
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                torch.distributed.broadcast(tensor.data, src=0)

    def average_gradients(self, params: list[torch.Tensor], bucket_elements: int = 2**24) -> None:
        """Each gradient replaced by its mean over the processes: one all-reduce per bucket of about
        `bucket_elements` values (64 MB in fp32), so the copy it needs stays small beside the model.
        Every process must hold gradients for the same parameters (they run the same window kinds)."""
        if not self.active:
            return
        grads = [p.grad for p in params if p.grad is not None]
        bucket: list[torch.Tensor] = []
        size = 0
        for grad in [*grads, None]:
            if grad is not None and (not bucket or size + grad.numel() <= bucket_elements):
                bucket.append(grad)
                size += grad.numel()
                continue
            if bucket:
                flat = torch.cat([g.reshape(-1) for g in bucket])
                torch.distributed.all_reduce(flat)
                flat /= self.world_size
                offset = 0
                for g in bucket:
                    g.copy_(flat[offset : offset + g.numel()].view_as(g))
                    offset += g.numel()
            bucket, size = ([grad], grad.numel()) if grad is not None else ([], 0)

    def close(self, finished: bool = False) -> None:
        """Leave the process group, once the run's objects are gone. `finished`: every process got here
        normally, so a barrier first lets every collective's work be released before the group goes."""
        if not (self.active and torch.distributed.is_initialized()):
            return
        gc.collect()  # objects kept alive by reference cycles go now, while the group is still alive
        if finished:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def from_environment(device: str = "auto", timeout_s: float = 3600.0) -> Distributed:
    """The process group torchrun asked for (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT), or a single
    process. NCCL when this process trains on a GPU, gloo on the CPU."""
    if not launched_by_torchrun():
        return Distributed()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = device != "cpu" and torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(local_rank)
    backend = "nccl" if on_gpu else "gloo"
    torch.distributed.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return Distributed(rank=rank, world_size=world_size, local_rank=local_rank, backend=backend)


def lock_run_folder(folder, dist: Distributed, flag: str = "--checkpoint_dir", output: bool = False):
    """The main process takes the folder's run.lock (finetune/system/run_lock.py; for an `output` folder,
    the lock file beside it); the other ranks are part of its run. Raises FolderBusy on every process when
    another run holds the folder."""
    from finetune.system.run_lock import FolderBusy, RunLock, output_lock

    lock, refusal = None, None
    if dist.is_main:
        try:
            lock = (output_lock(folder) if output else RunLock(folder, flag)).acquire()
        except FolderBusy as error:
            refusal = str(error)
    refusal = dist.broadcast(refusal)
    if refusal:
        raise FolderBusy(refusal)
    return lock
