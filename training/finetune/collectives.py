"""A rank's collectives, on the rank's device: every reduction the fine-tune issues goes through :class:`Collectives`.

A process group's backend reduces tensors of its own device only: NCCL reduces CUDA tensors, gloo CPU ones. A
worker that sums a CPU tensor under NCCL fails before its first step (``No backend type associated with device
type cpu``: what the first GPU run of this project saw). So the worker and its objectives never call
``torch.distributed`` with a tensor of their own making: they hand numbers to the helper, which builds or moves
the tensor onto ``device`` (the rank's: ``cuda:LOCAL_RANK`` with NCCL, ``cpu`` with gloo), reduces it there and
returns the result on the host, where the bookkeeping reads it.

    comm = Collectives(device)
    mean_loss = comm.mean(window_loss, window_steps)   # one float, the same on every rank
    totals = comm.sum(torch.tensor([tokens, pairs]))   # elementwise sums, on the host

Each call is a host sync (the result is read back): the training loop calls it every ``log_every`` steps, never
per micro-step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Collectives:
    """Sums and means of a rank's numbers across the process group, reduced on ``device``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of ``values`` over every rank (float64, on the host); ``values`` may live anywhere."""
        # always a copy (the reduction is in place): the caller's tensor is left as it was
        reduced = values.detach().to(device=self.device, dtype=torch.float64, copy=True)
        dist.all_reduce(reduced)
        return reduced.cpu()

    def mean(self, total: float | torch.Tensor, count: float | torch.Tensor) -> float:
        """Sum of ``total`` over the ranks divided by the sum of ``count`` (at least 1): a token- or pair-weighted
        mean. Either may be a tensor still on the device (a loss accumulated without host syncs)."""
        parts = [torch.as_tensor(x).to(device=self.device, dtype=torch.float64).reshape(()) for x in (total, count)]
        summed = self.sum(torch.stack(parts))
        return float(summed[0]) / max(float(summed[1]), 1.0)

    def barrier(self) -> None:
        """Wait for every rank (on NCCL, on this rank's GPU: the default would guess a device)."""
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()
