"""A rank's micro-batches, collated ahead of the training thread: host work off the critical path.

Collating a batch is Python work (token tuples into padded tensors); done on the training thread between two
steps, it leaves the GPU idle each time. :class:`Prefetcher` collates the next ``depth`` micro-batches on a
background thread, in the seeded order the step index decides (``training.finetune.order.Order``: a pure function of
the step, so a resumed run sees the same batches), pins them on a CUDA rank and copies each to the device without
blocking, while the GPU still runs the step before. The token count of each batch is counted there too, on the
host, so the loop never reads a device tensor back between log points.

    batches = Prefetcher(make, range(start, total), micro_steps=2, device=device)
    for step, micro, batch, tokens in batches:
        ...
    batches.close()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

Batch = dict[str, torch.Tensor]


def to_device(batch: Batch, device: torch.device) -> Batch:
    """A batch's tensors on ``device`` (asynchronous from pinned host memory)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


DEPTH = 4  # micro-batches collated ahead: enough to hide collation, few enough to hold little memory


@dataclass(frozen=True)
class Ready:
    step: int
    micro: int
    batch: Batch  # on the host (pinned on CUDA ranks)
    tokens: int  # attended tokens in the batch (input tokens, padding excluded)


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher:
    """Yields ``(step, micro, batch on device, tokens)`` for every micro-batch of ``steps``, in order.
    ``make(step, micro)`` collates one micro-batch on the host; an error there is raised in the training thread."""

    def __init__(
        self,
        make: Callable[[int, int], Batch],
        steps: range,
        *,
        micro_steps: int,
        device: torch.device,
        depth: int = DEPTH,
    ) -> None:
        self.make, self.steps, self.micro_steps, self.device = make, steps, micro_steps, device
        self.pin = device.type == "cuda"
        self._queue: queue.Queue[Ready | _Failed | None] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="batch-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for step in self.steps:
                for micro in range(self.micro_steps):
                    batch = self.make(step, micro)
                    tokens = int(batch["attention_mask"].sum())
                    if self.pin:
                        batch = {k: v.pin_memory() for k, v in batch.items()}
                    if not self._put(Ready(step, micro, batch, tokens)):
                        return
            self._put(None)
        except BaseException as exc:  # handed to the training thread, which raises it
            self._put(_Failed(exc))

    def _put(self, item: Ready | _Failed | None) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[tuple[int, int, Batch, int]]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item.step, item.micro, to_device(item.batch, self.device), item.tokens

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
