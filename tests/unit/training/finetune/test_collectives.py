"""Every collective a fine-tune rank issues reduces a tensor on the rank's device (training/finetune/collectives.py).

NCCL reduces CUDA tensors only: the first GPU run of the worker failed before its first step, summing a CPU tensor
(``No backend type associated with device type cpu``). These tests reproduce that on a CPU machine: the rank's
device is PyTorch's ``lazy`` device (the TorchScript lazy-tensor backend: a device other than the CPU, whose
tensors hold real values), and ``torch.distributed`` is replaced by :class:`StrictGroup`, a recording process
group that, like NCCL, rejects a tensor that is not on its device and otherwise sums as two identical ranks would
(the value doubled), so a result read back before the reduction shows too. Before the helper existed, the
objectives' validation and the reference pass failed here exactly as on the GPU.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from training.finetune.collectives import Collectives
from training.finetune.dpo import PairExample, collate_pairs, reference_logps
from training.finetune.objectives import Dpo, Sft
from training.finetune.sft_data import IGNORE, Example, collate
from training.finetune.worker import Window

WORLD = 2  # the strict group sums as two ranks holding the same values


@pytest.fixture(scope="module")
def rank_device() -> torch.device:
    import torch._lazy.ts_backend

    try:
        torch._lazy.ts_backend.init()
    except RuntimeError as exc:  # initialised once per process: a second init refuses to register again
        if "multiple backend fallbacks" not in str(exc):
            raise
    return torch.device("lazy")


class StrictGroup:
    """``torch.distributed``'s collectives as NCCL runs them, for a rank on ``device``: a tensor elsewhere is refused
    with NCCL's error; every call is recorded."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.calls: list[tuple[str, str]] = []  # (collective, device type)

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False):  # type: ignore[no-untyped-def]
        self.calls.append(("all_reduce", tensor.device.type))
        if tensor.device.type != self.device.type:
            raise RuntimeError(f"No backend type associated with device type {tensor.device.type}")
        tensor.mul_(WORLD)

    def barrier(self, group: Any = None, async_op: bool = False, device_ids: list[int] | None = None) -> None:
        self.calls.append(("barrier", self.device.type))


@pytest.fixture
def group(rank_device: torch.device, monkeypatch: pytest.MonkeyPatch) -> StrictGroup:
    strict = StrictGroup(rank_device)
    monkeypatch.setattr(dist, "all_reduce", strict.all_reduce)
    monkeypatch.setattr(dist, "barrier", strict.barrier)
    return strict


def test_the_strict_group_refuses_a_host_tensor_as_nccl_does(group: StrictGroup) -> None:
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        dist.all_reduce(torch.ones(2))


def test_sum_reduces_on_the_rank_device_and_reads_the_reduced_values_back(
    group: StrictGroup, rank_device: torch.device
) -> None:
    comm = Collectives(rank_device)
    values = torch.tensor([1.5, 2.0])
    summed = comm.sum(values)
    assert group.calls == [("all_reduce", rank_device.type)]
    assert summed.device.type == "cpu" and summed.dtype == torch.float64
    assert summed.tolist() == [3.0, 4.0]
    assert values.tolist() == [1.5, 2.0]  # the caller's tensor is not reduced in place


def test_sum_on_a_host_rank_leaves_the_callers_tensor_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    strict = StrictGroup(torch.device("cpu"))
    monkeypatch.setattr(dist, "all_reduce", strict.all_reduce)
    values = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert Collectives(torch.device("cpu")).sum(values).tolist() == [2.0, 4.0]
    assert values.tolist() == [1.0, 2.0]


def test_mean_takes_a_total_still_on_the_device(group: StrictGroup, rank_device: torch.device) -> None:
    comm = Collectives(rank_device)
    total = torch.tensor(6.0, device=rank_device)
    assert comm.mean(total, 3) == pytest.approx(2.0)  # (2 x 6) / (2 x 3)
    assert comm.mean(0.0, 0) == 0.0  # no count anywhere: 0, not a division by zero


class FakeEngine:
    """The piece of a DeepSpeed engine the objectives call: forward returning ``.loss`` or ``.logits``, on the
    device of its inputs; records the devices it saw."""

    def __init__(self, vocab: int = 8) -> None:
        self.vocab = vocab
        self.devices: set[str] = set()
        self.mode = "train"

    def eval(self) -> None:
        self.mode = "eval"

    def train(self) -> None:
        self.mode = "train"

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: Any = None) -> Any:
        self.devices |= {t.device.type for t in (input_ids, attention_mask)}
        # logits favour the next token id (+1), so log-probs differ between sequences
        logits = torch.nn.functional.one_hot((input_ids + 1) % self.vocab, self.vocab).float() * 2.0
        loss = None if labels is None else (labels != IGNORE).float().mean() + 1.0
        return SimpleNamespace(logits=logits, loss=loss)


def _example(ids: list[int], reply_from: int) -> Example:
    return Example(tuple(ids), tuple(IGNORE if i < reply_from else t for i, t in enumerate(ids)))


def test_sft_validation_reduces_on_the_rank_device(group: StrictGroup, rank_device: torch.device) -> None:
    sft = Sft.__new__(Sft)  # the validation batches alone: no tokenizer or snapshot needed
    sft.val_batches = [collate([_example([1, 2, 3, 4], 2), _example([1, 2, 3], 1)], pad_id=0)]
    engine = FakeEngine()
    result = sft.validate(engine, Collectives(rank_device))  # type: ignore[arg-type]
    assert engine.devices == {rank_device.type} and engine.mode == "train"
    assert {device for _, device in group.calls} == {rank_device.type}
    # labelled next tokens: 2 + 2 = 4 of 5 positions; loss = mean(labels != IGNORE) + 1 over the padded batch
    loss = float((sft.val_batches[0]["labels"] != IGNORE).float().mean() + 1.0)
    assert result["val_loss"] == pytest.approx(loss)


def test_dpo_validation_reduces_on_the_rank_device(group: StrictGroup, rank_device: torch.device) -> None:
    dpo = Dpo.__new__(Dpo)
    dpo.beta, dpo.sft_weight, dpo.kind = 0.5, 0.0, "sigmoid"
    pairs = [PairExample(_example([1, 2, 3, 4], 2), _example([1, 2, 5, 6], 2))]
    dpo.val_batches = [{**collate_pairs(pairs, pad_id=0), "ref": torch.zeros(1, 2)}]
    engine = FakeEngine()
    result = dpo.validate(engine, Collectives(rank_device))  # type: ignore[arg-type]
    assert engine.devices == {rank_device.type}
    assert group.calls == [("all_reduce", rank_device.type)]
    # chosen 1,2,3,4: each next token predicted by the +1 logits; rejected 1,2,5,6 misses token 5
    assert result["val_reward_accuracy"] == 1.0 and result["val_reward_margin"] > 0
    assert 0 < result["val_loss"] < 0.7


def test_the_reference_pass_reduces_on_the_rank_device_and_stores_the_sums(
    group: StrictGroup, rank_device: torch.device, tmp_path: Path
) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path / "ref")
    pairs = [PairExample(_example([1, 2, 3, 4], 2), _example([1, 2, 5, 6], 2))] * 3
    store = tmp_path / "reference_logps.pt"
    values = reference_logps(
        str(tmp_path / "ref"),
        pairs,
        pad_id=0,
        batch_size=2,
        rank=0,
        world=1,
        comm=Collectives(rank_device),
        store=store,
    )
    assert [name for name, _ in group.calls] == ["all_reduce", "barrier"]
    assert {device for _, device in group.calls} == {rank_device.type}
    assert values.device.type == "cpu" and values.shape == (3, 2)
    assert torch.equal(torch.load(store), values)
    assert (values < 0).all() and torch.allclose(values[0], values[1])  # two "ranks" summed: 2 x the log-probs


def test_the_training_window_keeps_its_loss_on_the_device_until_it_is_logged(
    group: StrictGroup, rank_device: torch.device
) -> None:
    window = Window()
    for loss in (1.0, 3.0):
        window.add(torch.tensor(loss, device=rank_device), 0.5)  # two micro-batches of one step
    window.steps, window.tokens = 1, 100
    assert window.loss is not None and window.loss.device.type == rank_device.type
    assert group.calls == []  # nothing reduced, nothing read back, until the log point
    loss, rate = window.close(Collectives(rank_device), world=WORLD)
    assert loss == pytest.approx(2.0) and rate > 0
    assert group.calls == [("all_reduce", rank_device.type)]
    assert window.loss is None and window.steps == 0 and window.tokens == 0
