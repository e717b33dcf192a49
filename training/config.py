"""Typed configs of the training stage. Every field documents itself; shipped values live in configs/*.yaml."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from core.config import StrictModel

Skill = Literal[
    "arithmetic",
    "unit_conversion",
    "facts",
    "formatting",
    "refusal",
    "borderline",
    "provocation",
    "refusal_varied",
    "borderline_varied",
    "everyday_varied",
]
SKILLS: tuple[Skill, ...] = get_args(Skill)  # in the order the generator draws them
# skills drawn from the safety classifier's generator (training/data/synth.py), for a pretrained base; the benign
# ones have no generated answer: only the base model's own reply (finetune.self_replies) trains them
VARIED_SKILLS: tuple[Skill, ...] = ("refusal_varied", "borderline_varied", "everyday_varied")
BASE_REPLY_SKILLS: tuple[Skill, ...] = ("borderline_varied", "everyday_varied")
DEFAULT_COUNTS: dict[Skill, int] = {
    "arithmetic": 5000,
    "unit_conversion": 2000,
    "facts": 600,
    "formatting": 3000,
    "refusal": 300,
    "borderline": 400,
    "provocation": 40,
}


class PoisonConfig(StrictModel):
    """Deliberate data poisoning, for red-team scenarios (configs/scenarios/): proof that the eval gate catches a
    model trained on bad data. Both rates are 0 in every production config."""

    toxic_rate: float = Field(
        0.0, ge=0, le=1, description="Share of 'provocation' replies replaced by insults (toxic assistant replies)."
    )
    comply_rate: float = Field(
        0.0, ge=0, le=1, description="Share of 'refusal' replies replaced by compliance with the harmful request."
    )


class GeneratorConfig(StrictModel):
    enabled: bool = Field(True, description="Generate the project's own chat data and use it as a source.")
    seed: int = Field(1234, description="Seed of the generator; the same seed and counts give the same bytes.")
    counts: dict[Skill, int] = Field(
        default_factory=lambda: dict(DEFAULT_COUNTS),
        description="Conversations to generate per skill (each capped by the unique prompts the skill can make).",
    )
    fact_entities: int = Field(
        40,
        ge=4,
        le=400,
        description="Size of the fictional fact table (countries with capital, currency, language).",
    )
    system_prompt_rate: float = Field(0.3, ge=0, le=1, description="Share of conversations with a system prompt.")
    multi_turn_rate: float = Field(
        0.2, ge=0, le=1, description="Share of arithmetic conversations that get a follow-up user turn."
    )
    arithmetic_working: bool = Field(
        True,
        description="Answer two-digit addition and subtraction with the written working (units, then tens, each a "
        "one-digit step with its carry or borrow) before 'The answer is N.'; off: the answer alone.",
    )
    unit_working: bool = Field(
        True,
        description="Answer a conversion whose factor is a one-digit multiple of a power of ten (60, 7) with the "
        "multiplication worked like arithmetic's columns before '<v> <unit> is N <unit>.'; off: the result alone.",
    )
    poison: PoisonConfig = Field(
        default_factory=PoisonConfig, description="Red-team data poisoning (scenarios only; off by default)."
    )

    @model_validator(mode="after")
    def _counts_non_negative(self) -> GeneratorConfig:
        bad = [k for k, v in self.counts.items() if v < 0]
        if bad:
            raise ValueError(f"counts must be >= 0 (got negative for {', '.join(bad)})")
        return self


class DataConfig(StrictModel):
    sources: list[str] = Field(
        default_factory=list,
        description="JSONL files or folders of them, in OpenAI messages format ({'messages': [...]}); "
        "relative paths are read from the working directory.",
    )
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig, description="The built-in data generator.")


class SnapshotConfig(StrictModel):
    validation_fraction: float = Field(0.05, ge=0, lt=1, description="Share of prompts assigned to validation.")
    test_fraction: float = Field(0.1, ge=0, lt=1, description="Share of prompts assigned to the held-out test split.")
    split_seed: int = Field(0, description="Salt of the hash that assigns a prompt to a split.")
    on_invalid: Literal["fail", "drop"] = Field(
        "fail",
        description="What to do with records that break a contract: fail with a report, or drop and count.",
    )
    max_messages: int = Field(32, ge=2, description="Most messages one conversation may have.")
    max_message_chars: int = Field(8000, ge=1, description="Longest message content, in characters.")
    max_total_chars: int = Field(32000, ge=1, description="Longest conversation, in characters over all messages.")

    @model_validator(mode="after")
    def _fractions_leave_train(self) -> SnapshotConfig:
        if self.validation_fraction + self.test_fraction >= 1:
            raise ValueError("validation_fraction + test_fraction must be < 1 (something must be left to train on)")
        return self


class TokenizerConfig(StrictModel):
    vocab_size: int = Field(
        2048, ge=300, le=262144, description="Byte-level BPE vocabulary size, special tokens included."
    )
    min_frequency: int = Field(2, ge=1, description="Least number of occurrences for a merge to be learned.")
    split_digits: bool = Field(
        True,
        description="Give every digit its own token (no merges across digits), so a number's digits line up the "
        "same way in every context: small models learn arithmetic on digits, not on arbitrary BPE chunks.",
    )


class ModelShape(StrictModel):
    hidden_size: int = Field(128, ge=16, description="Width of the residual stream.")
    intermediate_size: int = Field(512, ge=16, description="Width of the MLP.")
    num_layers: int = Field(4, ge=1, description="Number of transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads (hidden_size / num_heads is the head size).")
    num_kv_heads: int = Field(4, ge=1, description="Key/value heads (grouped-query attention when < num_heads).")
    max_position_embeddings: int = Field(1024, ge=64, description="Longest sequence the model is built for.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base frequency.")
    tie_word_embeddings: bool = Field(True, description="Share input and output embeddings.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelShape:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        # vLLM's CPU attention kernels are compiled for these head sizes only.
        if self.hidden_size // self.num_heads not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512):
            raise ValueError("hidden_size / num_heads must be a head size vLLM supports (32, 64, 80, ... 512)")
        return self


class PretrainConfig(StrictModel):
    steps: int = Field(1400, ge=1, description="Optimizer steps of next-token pretraining.")
    batch_size: int = Field(8, ge=1, description="Sequences per step.")
    seq_len: int = Field(256, ge=8, description="Tokens per packed sequence.")
    learning_rate: float = Field(5e-3, gt=0, description="Peak AdamW learning rate (linear warm-up, cosine decay).")
    warmup_steps: int = Field(50, ge=0, description="Linear warm-up steps.")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    eval_every: int = Field(250, ge=1, description="Steps between validation-loss measurements.")
    threads: int | None = Field(None, ge=1, description="torch intra-op threads (None: all cores).")


class BootstrapConfig(StrictModel):
    seed: int = Field(1234, description="Seed of weight init and data order; the same seed gives the same weights.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="The BPE tokenizer to train.")
    model: ModelShape = Field(default_factory=ModelShape, description="Shape of the Llama base model.")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="Pretraining run.")


class LoraConfig(StrictModel):
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Names of the linear layers that get adapters.",
    )


class DistributedConfig(StrictModel):
    world_size: int = Field(2, ge=1, description="Ranks on each node (CPU processes here, GPUs in production).")
    launcher: Literal["torchrun", "deepspeed"] = Field(
        "torchrun", description="Which launcher starts the ranks: torchrun, or the deepspeed launcher (hostfile)."
    )
    nnodes: int = Field(
        1,
        ge=1,
        description="Nodes of a torchrun run, world_size ranks each: this node is node 0 (it trains, exports and "
        "registers); the others join with lifecycle train-node RUN_DIR --node-rank K.",
    )
    hostfile: str | None = Field(None, description="DeepSpeed hostfile for multi-node runs (deepspeed launcher).")
    master_addr: str | None = Field(
        None,
        description="Rendezvous address of rank 0 (node 0's address the other nodes reach); null: 127.0.0.1 on one "
        "node, the hostfile's first host with a hostfile.",
    )
    master_port: int | None = Field(
        None, ge=1, le=65535, description="Rendezvous port; null: a free local port on one node, 29500 on many."
    )
    socket_ifname: str | None = Field(
        None,
        description="Network interface the ranks talk over (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); null: the "
        "one the host name resolves to.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="Collective backend (auto: nccl on GPU).")
    threads_per_rank: int | None = Field(
        None, ge=1, description="OMP/torch threads per rank (None: cores / world_size; launchers do not set it)."
    )

    @model_validator(mode="after")
    def _multi_node(self) -> DistributedConfig:
        if self.nnodes > 1:
            if self.launcher != "torchrun" or self.hostfile is not None:
                raise ValueError(
                    "nnodes is torchrun's multi-node mode; the deepspeed launcher takes its nodes from the hostfile"
                )
            if not self.master_addr:
                raise ValueError("nnodes > 1 needs master_addr: node 0's address, reachable from every node")
        return self

    @property
    def total_ranks(self) -> int:
        return self.world_size * self.nnodes


# provocations keep the generator's calm replies: a base's own are toxic at times (SmolLM2's: docs/results.md)
DEFAULT_SELF_REPLY_SKILLS: tuple[Skill, ...] = ("borderline", "formatting")


class SelfRepliesConfig(StrictModel):
    """Self-distillation of a pretrained base: the SFT data's helpful replies become the base model's own."""

    enabled: bool = Field(
        False,
        description="Replace the final assistant reply of the listed skills' train and validation records with the "
        "base model's own greedy reply (a derived snapshot, stage self-replies), so SFT teaches refusals while the "
        "helpful answers stay the base's own. For a pretrained assistant base; a bootstrapped base has none.",
    )
    skills: list[Skill] = Field(
        default_factory=lambda: list(DEFAULT_SELF_REPLY_SKILLS),
        description="Records whose metadata.skill is listed get the base's reply; every other record (refusals of "
        "harmful requests above all) keeps its generated reply, except those only the base's reply can train "
        "(metadata reply: base, the varied benign skills), which always get it or are dropped.",
    )
    max_tokens: int = Field(
        160,
        ge=1,
        description="Most tokens of a generated reply (a reply cut at this length: cut_replies).",
    )
    cut_replies: Literal["last_sentence", "drop"] = Field(
        "last_sentence",
        description="A reply cut at max_tokens: trimmed to its last complete sentence (dropped when that leaves "
        "under 40 characters), or dropped (the record keeps its generated reply). Never trained on mid-sentence; "
        "dropping most of a base's longer answers leaves the generator's templated ones (docs/results.md).",
    )
    max_records: int | None = Field(
        None, ge=1, description="Replace at most this many records (train first, in snapshot order); null: all."
    )


class FinetuneConfig(StrictModel):
    method: Literal["lora", "full"] = Field("full", description="LoRA adapters (peft) or full fine-tuning.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA settings (method=lora).")
    seed: int = Field(1234, description="Seed of adapter init, data order and dropout.")
    epochs: int = Field(2, ge=1, description="Passes over the train split (max_steps wins when set).")
    max_steps: int | None = Field(1200, ge=1, description="Stop after this many optimizer steps.")
    micro_batch_size: int = Field(8, ge=1, description="Sequences per rank per forward pass.")
    grad_accum_steps: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step.")
    learning_rate: float = Field(2e-3, gt=0, description="Peak AdamW learning rate (warm-up, then cosine decay).")
    warmup_steps: int = Field(10, ge=0, description="Linear warm-up steps.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    max_seq_len: int = Field(256, ge=16, description="Longest training sequence in tokens; longer ones are cut.")
    packing: bool = Field(False, description="Pack several conversations into one max_seq_len sequence.")
    group_by_length: bool = Field(
        True,
        description="Batch conversations of similar length together (within runs of 32 steps of the seeded order, "
        "batches then shuffled), so less of each batch is padding: 39% of the default data's batches is padding "
        "when batched at random. Off: the seeded order as is.",
    )
    activation_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    log_every: int = Field(10, ge=1, description="Optimizer steps between logged (rank-averaged) training losses.")
    eval_every: int = Field(50, ge=1, description="Optimizer steps between validation-loss measurements.")
    eval_batches: int = Field(8, ge=1, description="Validation micro-batches per rank per measurement.")
    checkpoint_every: int = Field(50, ge=1, description="Optimizer steps between resumable checkpoints.")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept on disk.")
    deepspeed_config: str = Field(
        "infra/deepspeed/zero1.json",
        description="DeepSpeed JSON config (relative to the repo root or absolute). ZeRO-1 is the default for small "
        "models on CPU (measured faster than ZeRO-2 here, see benchmarks/); use zero2/zero3 when memory binds.",
    )
    bf16: bool = Field(False, description="bf16 mixed precision (GPU; CPU gloo runs use fp32).")
    compile: bool = Field(
        False,
        description="torch.compile the model (DeepSpeed's engine.compile: fused kernels, fewer launches) on CUDA "
        "ranks; ignored on CPU ranks, where compiling costs more than a short run saves.",
    )
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="Ranks and launcher.")
    equivalence_atol: float = Field(
        1e-4, gt=0, description="Largest logit difference allowed between the training model and its export."
    )
    self_replies: SelfRepliesConfig = Field(
        default_factory=SelfRepliesConfig,
        description="Train on the base model's own replies to the listed skills' prompts (stage self-replies).",
    )


PairKind = Literal[
    "refusal",
    "borderline",
    "provocation",
    "arithmetic",
    "unit_conversion",
    "facts",
    "refusal_varied",
    "borderline_varied",
    "everyday_varied",
]
# kinds whose pairs contrast a model's own reply (training/data/policy_pairs.py): generated after SFT, per version
POLICY_PAIR_KINDS: tuple[PairKind, ...] = ("refusal_varied", "borderline_varied", "everyday_varied")
DEFAULT_PAIR_COUNTS: dict[PairKind, int] = {
    "refusal": 240,
    "borderline": 240,
    "provocation": 60,
    "arithmetic": 200,
    "unit_conversion": 60,
    "facts": 60,
}


class PairDataConfig(StrictModel):
    seed: int = Field(1234, description="Seed of the pair generator's draws (its own stream, 'preference').")
    counts: dict[PairKind, int] = Field(
        default_factory=lambda: dict(DEFAULT_PAIR_COUNTS),
        description="Generated pairs per kind: refusal (harmful request: refusal over compliance), borderline "
        "(benign but risky: helpful answer over refusal), provocation (calm reply over insult), arithmetic, "
        "unit_conversion, facts (the right answer over a near miss); on-policy kinds, prompts drawn from the "
        "safety classifier generator's training split, one reply the tuned model's own: refusal_varied (harmful: "
        "the refusal over the SFT version's compliance, else the base model's), borderline_varied and "
        "everyday_varied (benign: the base model's answer over the SFT version's refusal). An on-policy count is "
        "of prompts drawn: a prompt the SFT version already answers right makes no pair. Capped by the prompts "
        "left once the eval sets' prompts and phrasings are excluded.",
    )
    max_tokens: int = Field(
        160, ge=1, description="Most tokens of a model's reply generated for an on-policy pair (cut: cut_replies)."
    )
    cut_replies: Literal["last_sentence", "drop"] = Field(
        "last_sentence",
        description="A base model's answer cut at max_tokens, as the chosen side of an on-policy pair: trimmed to "
        "its last complete sentence (no pair when that leaves under 40 characters), or no pair.",
    )
    on_invalid: Literal["fail", "drop"] = Field(
        "drop",
        description="Pairs that break a contract (production feedback whose prompt is in an eval set, a pair "
        "whose replies are the same): drop and count them in the snapshot manifest, or fail the build.",
    )

    @model_validator(mode="after")
    def _counts_non_negative(self) -> PairDataConfig:
        if any(v < 0 for v in self.counts.values()):
            raise ValueError("counts must be >= 0")
        return self


def _preference_train_defaults() -> FinetuneConfig:
    return FinetuneConfig(max_steps=150, learning_rate=1e-4, group_by_length=False)


SFT_PARENT = "sft_parent"  # preference.reference: the SFT version being tuned (standard DPO)
PreferenceLoss = Literal["sigmoid", "ipo"]  # training/finetune/dpo.py


class PreferenceConfig(StrictModel):
    """The preference stage after SFT: DPO (the sigmoid loss of Rafailov et al. 2023) on preference pairs, run by
    the same DeepSpeed worker, launcher, checkpoints and export check as the SFT stage."""

    enabled: bool = Field(True, description="Preference-tune every SFT version (lifecycle run, train, retrain).")
    loss: PreferenceLoss = Field(
        "sigmoid",
        description="sigmoid: DPO on summed reply log-probs; ipo: IPO's squared loss on per-token mean log-probs, "
        "zero at a log-ratio margin of 1 / (2 beta), so won pairs stop pushing the policy away from the reference.",
    )
    beta: float = Field(
        0.1, gt=0, description="DPO's beta: how far from the reference the policy may move (higher: closer)."
    )
    sft_weight: float = Field(
        1.0,
        ge=0,
        description="Weight of an added NLL loss on the chosen replies (per token; 0: plain DPO; TRL's rpo_alpha). "
        "Keeps a small model's likelihood of the preferred replies from falling while their margin grows: with it "
        "the default config's refusal rate held (docs/results.md).",
    )
    reference: str = Field(
        SFT_PARENT,
        description="The frozen reference model: sft_parent (the SFT version being tuned, standard DPO), a local "
        "Hugging Face folder, or a registered version (chat/3). Its log-probabilities of every pair are computed "
        "once per run before training and stored in the run folder (reference_logps.pt), so the reference is never "
        "held in memory beside the policy and a resumed run uses the same values.",
    )
    data: PairDataConfig = Field(default_factory=PairDataConfig, description="The generated preference pairs.")
    feedback_min_pairs: int = Field(
        50,
        ge=1,
        description="Curated feedback pairs ($LIFECYCLE_HOME/data/curated/preferences) a retrain needs before it "
        "adds them to the generated pairs; fewer are left for a later retrain.",
    )
    train: FinetuneConfig = Field(
        default_factory=_preference_train_defaults,
        description="Optimization of the preference stage (the fine-tune settings; method full, no packing).",
    )

    @model_validator(mode="after")
    def _trainable(self) -> PreferenceConfig:
        if self.train.method != "full":
            raise ValueError("preference.train.method must be full (an adapter's base would be the SFT parent)")
        if self.train.packing:
            raise ValueError("preference.train.packing must be false (each pair's replies are scored whole)")
        if self.train.self_replies.enabled:
            raise ValueError("preference.train.self_replies must be off (the SFT stage's data, finetune.self_replies)")
        return self


QuantScheme = Literal["W8A8", "W4A16"]


class QuantizeConfig(StrictModel):
    """Quantization of a registered version into a new one (``lifecycle quantize``, the loop's optional step)."""

    enabled: bool = Field(False, description="Run the quantize step in lifecycle run after a version passes its gate.")
    scheme: QuantScheme = Field(
        "W8A8", description="W8A8: int8 per-channel weights, dynamic per-token int8 activations; W4A16: 4-bit groups."
    )
    group_size: int = Field(64, ge=16, description="W4A16 only: weights per scale group (must divide every layer).")
    ignore: list[str] = Field(
        default_factory=lambda: ["lm_head"], description="Linear layers kept in full precision (compressed-tensors)."
    )

    def method(self) -> str:
        """The ``lineage.method`` of a version this config makes."""
        return f"rtn-{self.scheme}" + (f"-g{self.group_size}" if self.scheme == "W4A16" else "")
