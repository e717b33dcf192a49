"""The DPO loss against values computed by hand (training/finetune/dpo.py), and pair encoding on a real chat
template."""

from __future__ import annotations

import math

import pytest
import torch

from training.config import FinetuneConfig, GeneratorConfig, PreferenceConfig, TokenizerConfig
from training.data.synth import generate
from training.finetune.dpo import collate_pairs, dpo_loss, encode_pairs, pair_loss, sequence_logps
from training.finetune.sft_data import IGNORE
from training.model.tokenizer import train_tokenizer


def test_sequence_logps_sums_the_labelled_tokens_predicted_from_the_one_before() -> None:
    # vocabulary of 4; position t's logits predict token t+1
    logits = torch.zeros(1, 4, 4)
    logits[0, 1] = torch.tensor([0.0, math.log(3.0), 0.0, 0.0])  # p(token 1) = 3/6 at position 1
    labels = torch.tensor([[IGNORE, IGNORE, 1, 2]])  # tokens 2 and 3 are the reply: predicted at positions 1, 2
    logps, counts = sequence_logps(logits, labels)
    assert counts.tolist() == [2]
    assert logps.item() == pytest.approx(math.log(0.5) + math.log(0.25))


def test_dpo_loss_matches_the_hand_computed_value() -> None:
    # policy log-probs chosen -1, rejected -2; reference -1.5 for both; beta 0.5:
    # margin = 0.5 * ((-1 + 1.5) - (-2 + 1.5)) = 0.5, loss = -log(sigmoid(0.5)) = log(1 + e^-0.5) = 0.474077
    loss, chosen_r, rejected_r = dpo_loss(
        torch.tensor([-1.0, -3.0]),
        torch.tensor([-2.0, -1.0]),
        torch.tensor([-1.5, -2.0]),
        torch.tensor([-1.5, -2.0]),
        0.5,
    )
    # second pair: margin = 0.5 * ((-3 + 2) - (-1 + 2)) = -1.0, loss = log(1 + e^1) = 1.313262
    assert loss.item() == pytest.approx((0.474077 + 1.313262) / 2, abs=1e-6)
    assert chosen_r.tolist() == pytest.approx([0.25, -0.5]) and rejected_r.tolist() == pytest.approx([-0.25, 0.5])


def test_at_the_reference_the_loss_is_log_2_and_its_gradient_favours_chosen() -> None:
    chosen = torch.tensor([-4.0], requires_grad=True)
    rejected = torch.tensor([-4.0], requires_grad=True)
    loss, _, _ = dpo_loss(chosen, rejected, chosen.detach(), rejected.detach(), 0.1)
    loss.backward()
    assert loss.item() == pytest.approx(math.log(2))
    assert chosen.grad is not None and rejected.grad is not None
    assert chosen.grad.item() == pytest.approx(-0.05) and rejected.grad.item() == pytest.approx(0.05)


def test_pair_loss_on_a_batch_is_dpo_plus_the_weighted_chosen_nll() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 5, 6)  # 2 pairs: rows 0, 1 chosen; 2, 3 rejected
    labels = torch.tensor([[IGNORE, IGNORE, 1, 2, 3]] * 4)
    ref = torch.tensor([[-5.0, -6.0], [-7.0, -4.0]])
    logps, counts = sequence_logps(logits, labels)
    expected, _, _ = dpo_loss(logps[:2], logps[2:], ref[:, 0], ref[:, 1], 0.2)
    plain, stats = pair_loss(logits, labels, ref, beta=0.2, sft_weight=0.0)
    assert plain.item() == pytest.approx(expected.item())
    with_nll, _ = pair_loss(logits, labels, ref, beta=0.2, sft_weight=0.5)
    assert with_nll.item() == pytest.approx(expected.item() + 0.5 * float((-logps[:2] / counts[:2]).mean()))
    assert stats["correct"].item() in (0.0, 1.0, 2.0)


def test_ipo_loss_matches_the_hand_computed_value_and_is_zero_at_its_target_margin() -> None:
    # log-ratio margins h: pair 1 (-1 + 1.5) - (-2 + 1.5) = 1.0; pair 2 (-3 + 2) - (-1 + 2) = -2.0; beta 0.25: the
    # target margin is 1 / (2 * 0.25) = 2, loss = ((1 - 2)^2 + (-2 - 2)^2) / 2 = (1 + 16) / 2 = 8.5
    args = (torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]), torch.tensor([-1.5, -2.0]))
    loss, chosen_r, _ = dpo_loss(*args, torch.tensor([-1.5, -2.0]), 0.25, "ipo")
    assert loss.item() == pytest.approx(8.5)
    assert chosen_r.tolist() == pytest.approx([0.125, -0.25])
    # past the target margin the loss grows again (sigmoid DPO would keep falling): a won pair pulls back
    chosen = torch.tensor([1.0], requires_grad=True)
    loss, _, _ = dpo_loss(chosen, torch.tensor([-2.0]), torch.tensor([0.0]), torch.tensor([0.0]), 0.25, "ipo")
    loss.backward()
    assert loss.item() == pytest.approx(1.0) and chosen.grad is not None and chosen.grad.item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown preference loss"):
        dpo_loss(*args, torch.tensor([-1.5, -2.0]), 0.25, "kto")


def test_ipo_pair_loss_uses_per_token_means_of_policy_and_reference() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 6)
    labels = torch.tensor([[IGNORE, IGNORE, 1, 2, 3, 4], [IGNORE, IGNORE, IGNORE, IGNORE, 1, 2]] * 2)
    ref = torch.tensor([[-5.0, -6.0], [-7.0, -4.0]])
    logps, counts = sequence_logps(logits, labels)
    mean, ref_mean = logps / counts, torch.cat([ref[:, 0], ref[:, 1]]) / counts
    expected, _, _ = dpo_loss(mean[:2], mean[2:], ref_mean[:2], ref_mean[2:], 0.5, "ipo")
    loss, _ = pair_loss(logits, labels, ref, beta=0.5, sft_weight=0.0, kind="ipo")
    assert counts.tolist() == [4, 2, 4, 2]
    assert loss.item() == pytest.approx(expected.item())


def test_pairs_encode_both_replies_on_the_same_prompt() -> None:
    records = generate(GeneratorConfig(counts={"arithmetic": 50, "refusal": 20}))
    tok = train_tokenizer([m["content"] for r in records for m in r["messages"]], TokenizerConfig(vocab_size=400), 128)
    record = {
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "chosen": "The answer is 4.",
        "rejected": "The answer is 5.",
    }
    enc = encode_pairs([record, {**record, "messages": [{"role": "user", "content": "x " * 200}]}], tok, 64)
    assert enc.skipped == 1 and len(enc.pairs) == 1  # a prompt that fills max_seq_len leaves no reply to score
    (p,) = enc.pairs
    assert tok.decode([t for t in p.chosen.labels if t != IGNORE]) == "The answer is 4.<|end|>"
    assert tok.decode([t for t in p.rejected.labels if t != IGNORE]) == "The answer is 5.<|end|>"
    batch = collate_pairs(enc.pairs * 3, tok.pad_token_id)
    assert batch["input_ids"].shape[0] == 6 and torch.equal(batch["labels"][0], batch["labels"][2])


def test_preference_config_trains_full_weights_without_packing() -> None:
    with pytest.raises(ValueError, match="method must be full"):
        PreferenceConfig(train=FinetuneConfig(method="lora"))
    with pytest.raises(ValueError, match="packing must be false"):
        PreferenceConfig(train=FinetuneConfig(method="full", packing=True))
