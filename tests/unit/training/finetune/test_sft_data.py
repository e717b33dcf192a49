from __future__ import annotations

from pathlib import Path

import pytest

from training.config import FinetuneConfig, GeneratorConfig, TokenizerConfig
from training.data.synth import generate
from training.finetune.launch import resolve_deepspeed_config
from training.finetune.order import Order
from training.finetune.sft_data import IGNORE, Example, collate, encode, pack
from training.model.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    records = generate(GeneratorConfig(counts={"arithmetic": 100, "refusal": 20}))
    return train_tokenizer([m["content"] for r in records for m in r["messages"]], TokenizerConfig(vocab_size=400), 128)


CONVO = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "The answer is 4."},
        {"role": "user", "content": "Now add 1 to that."},
        {"role": "assistant", "content": "The answer is 5."},
    ]
}


def test_loss_only_on_assistant_tokens(tok) -> None:  # type: ignore[no-untyped-def]
    enc = encode([CONVO], tok, 256)
    (ex,) = enc.examples
    targets = [t for t in ex.labels if t != IGNORE]
    assert tok.decode(targets) == "The answer is 4.<|end|>The answer is 5.<|end|>"
    assert len(ex.input_ids) == len(ex.labels)


def test_truncation_and_skipping_are_counted(tok) -> None:  # type: ignore[no-untyped-def]
    full = len(encode([CONVO], tok, 256).examples[0].input_ids)
    cut = encode([CONVO], tok, full - 3)
    assert cut.truncated == 1 and len(cut.examples[0].input_ids) == full - 3
    none_left = encode([CONVO], tok, 8)  # only the system prompt fits: nothing to learn from
    assert none_left.skipped == 1 and none_left.examples == []


def test_packing_keeps_whole_examples_within_the_limit() -> None:
    examples = [Example(tuple(range(n)), tuple(range(n))) for n in (5, 4, 3, 6, 2)]
    packed = pack(examples, 9)
    assert [len(p.input_ids) for p in packed] == [9, 9, 2]
    assert sum(len(p.input_ids) for p in packed) == 20
    assert packed[0].input_ids == (0, 1, 2, 3, 4, 0, 1, 2, 3)


def test_collate_pads_and_masks() -> None:
    batch = collate([Example((5, 6, 7), (IGNORE, 6, 7)), Example((8,), (8,))], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 6, 7], [8, IGNORE, IGNORE]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_rank_orders_are_disjoint_seeded_and_change_each_epoch() -> None:
    a = Order(100, world=2, rank=0, seed=1, per_step=8)
    b = Order(100, world=2, rank=1, seed=1, per_step=8)
    assert a.steps_per_epoch == 6  # 50 per rank, 6 full steps of 8
    epoch0 = [i for s in range(6) for i in a.step(s)] + [i for s in range(6) for i in b.step(s)]
    assert len(set(epoch0)) == 96
    assert a.step(6) != a.step(0)  # a new shuffle for epoch 1
    again = Order(100, world=2, rank=0, seed=1, per_step=8)
    assert again.step(7) == a.step(7)  # resuming mid-epoch lands on the same samples
    assert Order(100, world=2, rank=0, seed=2, per_step=8).step(0) != Order(100, 2, 0, 1, 8).step(0)


def test_grouping_by_length_keeps_the_epoch_and_cuts_the_padding() -> None:
    import random

    rng = random.Random(0)
    lengths = [rng.choice([12, 20, 28, 40, 64, 93]) + rng.randrange(8) for _ in range(2000)]
    plain = [Order(2000, world=2, rank=r, seed=1, per_step=8) for r in (0, 1)]
    grouped = [Order(2000, world=2, rank=r, seed=1, per_step=8, lengths=lengths) for r in (0, 1)]
    steps = plain[0].steps_per_epoch
    assert grouped[0].steps_per_epoch == steps == 125

    def epoch(orders: list[Order], e: int) -> list[int]:
        return [i for s in range(e * steps, (e + 1) * steps) for o in orders for i in o.step(s)]

    # the same examples each epoch as the plain order, each once, split between the ranks
    assert sorted(epoch(grouped, 0)) == sorted(epoch(plain, 0)) and len(set(epoch(grouped, 0))) == 2000
    assert epoch(grouped, 1) != epoch(grouped, 0)  # a new order each epoch

    def padding(orders: list[Order]) -> float:
        padded = real = 0
        for s in range(steps):
            for o in orders:
                batch = [lengths[i] for i in o.step(s)]
                padded, real = padded + max(batch) * len(batch), real + sum(batch)
        return 1 - real / padded

    assert padding(plain) > 0.3 and padding(grouped) < 0.1
    # the ranks of one step get alike lengths (neither waits on a longer batch)
    widths = [
        abs(max(lengths[i] for i in grouped[0].step(s)) - max(lengths[i] for i in grouped[1].step(s)))
        for s in range(steps)
    ]
    assert sum(widths) / steps < 8
    again = Order(2000, world=2, rank=1, seed=1, per_step=8, lengths=lengths)
    assert again.step(steps + 7) == grouped[1].step(steps + 7)  # a resumed run sees the same batches


def test_deepspeed_config_is_filled_from_the_run() -> None:
    cfg = FinetuneConfig(micro_batch_size=4, grad_accum_steps=3, max_grad_norm=0.5)
    path, ds = resolve_deepspeed_config(cfg)
    assert path.name == "zero1.json"
    assert ds["train_batch_size"] == 4 * 3 * cfg.distributed.world_size
    assert ds["gradient_accumulation_steps"] == 3 and ds["gradient_clipping"] == 0.5
    assert ds["zero_optimization"]["stage"] == 1 and ds["bf16"]["enabled"] is False


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[4] / "infra/deepspeed").glob("*.json")))
def test_every_shipped_deepspeed_config_resolves(name: str) -> None:
    _, ds = resolve_deepspeed_config(FinetuneConfig(deepspeed_config=f"infra/deepspeed/{name}", bf16="bf16" in name))
    assert ds["zero_optimization"]["stage"] in (1, 2, 3)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('{"zero_optimization": {"stage": 7}}', "stage must be 0-3"),
        ("[1, 2]", "must hold a JSON object"),
    ],
)
def test_bad_deepspeed_configs_are_config_errors(tmp_path: Path, content: str, message: str) -> None:
    from core.errors import ConfigError

    bad = tmp_path / "ds.json"
    bad.write_text(content)
    with pytest.raises(ConfigError, match=message):
        resolve_deepspeed_config(FinetuneConfig(deepspeed_config=str(bad)))
    with pytest.raises(ConfigError, match="file not found"):
        resolve_deepspeed_config(FinetuneConfig(deepspeed_config=str(tmp_path / "missing.json")))


def test_bf16_refuses_zero_stage_0(tmp_path: Path) -> None:
    from core.errors import ConfigError

    ds = tmp_path / "z0.json"
    ds.write_text('{"zero_optimization": {"stage": 0}}')
    with pytest.raises(ConfigError, match="bf16 needs ZeRO stage 1-3"):
        resolve_deepspeed_config(FinetuneConfig(deepspeed_config=str(ds), bf16=True))
