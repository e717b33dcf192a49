"""Which training items a rank sees at each step: a pure function of (seed, epoch, step), so a resumed run sees the
same batches as an uninterrupted one."""

from __future__ import annotations

import random

import torch
from torch.utils.data import DistributedSampler

GROUP_STEPS = 32  # group_by_length sorts runs of this many global steps of the seeded order by length


class Order:
    """Which examples a rank sees at a given step: a DistributedSampler order per epoch (seeded, drop_last); with
    ``lengths``, grouped by length (``group_by_length``). Either is a pure function of (seed, epoch), so a resumed
    run sees the same batches as an uninterrupted one."""

    def __init__(
        self, n: int, world: int, rank: int, seed: int, per_step: int, lengths: list[int] | None = None
    ) -> None:
        # the sampler only needs len(): a range stands in for the dataset
        self.sampler: DistributedSampler[int] = DistributedSampler(
            range(n),  # type: ignore[arg-type]
            num_replicas=world,
            rank=rank,
            shuffle=True,
            seed=seed,
            drop_last=True,
        )
        self.n, self.world, self.rank, self.seed, self.per_step = n, world, rank, seed, per_step
        self.lengths = lengths
        self.steps_per_epoch = len(self.sampler) // per_step
        self._epoch = -1
        self._indices: list[int] = []

    def step(self, step: int) -> list[int]:
        epoch, within = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self.sampler.set_epoch(epoch)
            self._indices = list(iter(self.sampler)) if self.lengths is None else self._grouped(epoch)
            self._epoch = epoch
        return self._indices[within * self.per_step : (within + 1) * self.per_step]

    def _grouped(self, epoch: int) -> list[int]:
        """The sampler's global order for the epoch, cut into runs of GROUP_STEPS global steps; each run sorted by
        length and cut into global steps (all ranks' examples of a step alike in length, so no rank waits on a
        longer batch); the steps shuffled; this rank's share of each."""
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)  # DistributedSampler's own permutation
        per_global = self.per_step * self.world
        order = torch.randperm(self.n, generator=g).tolist()[: self.steps_per_epoch * per_global]
        assert self.lengths is not None
        lengths = self.lengths
        steps: list[list[int]] = []
        for start in range(0, len(order), per_global * GROUP_STEPS):
            run = sorted(order[start : start + per_global * GROUP_STEPS], key=lambda i: lengths[i])
            steps += [run[k : k + per_global] for k in range(0, len(run), per_global)]
        random.Random(self.seed + epoch).shuffle(steps)
        return [i for s in steps for i in s[self.rank :: self.world]]
