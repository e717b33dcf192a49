"""The ``serving:`` section of the root config: where the endpoint listens, which registered versions it serves,
its vLLM engines, keys and limits, the context budget, safety filters, brownout and latency targets, shadow
mirroring and fault injection.

Every threshold lives here (YAML), not in code. ``lifecycle serve`` and ``bentoml serve serving.service:Gateway``
read the same object.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from core.config import StrictModel
from core.machine import available_cpus

# the pre-filter's answer to a self-harm request the classifier blocks: support and where to find help, no method
SELF_HARM_SUPPORT = (
    "I'm really sorry you're feeling this way, and I can't help with anything that could hurt you. You don't have "
    "to go through this alone: please talk to someone you trust, or reach a crisis line now (call or text 988 in "
    "the US and Canada, 116 123 for Samaritans in the UK and Ireland, or your local emergency number)."
)

Dtype = Literal["auto", "bfloat16", "float16", "float32"]


class EngineSettings(StrictModel):
    dtype: Dtype = Field(
        "auto",
        description="Weights and activations dtype. auto: on a CPU, bfloat16 where it has bf16 instructions "
        "(AVX-512 BF16 or AMX; measured 1.5-1.7x faster than fp32 there) and float32 elsewhere, kernels held to "
        "AVX2 included (bf16 measured 3.6x slower than fp32 on an AVX2-only AMD EPYC); on a GPU, vLLM's own choice.",
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Context window in tokens; null: the model's max_position_embeddings."
    )
    max_num_seqs: int = Field(64, ge=1, description="Sequences the scheduler runs at once (continuous batching).")
    enable_prefix_caching: bool = Field(True, description="Reuse KV blocks of shared prompt prefixes.")
    max_loras: int = Field(4, ge=1, description="LoRA adapters resident at once on a shared base engine.")
    max_lora_rank: Literal[8, 16, 32, 64, 128, 256] = Field(
        16, description="Largest adapter rank the engine accepts (vLLM allows these values)."
    )
    seed: int = Field(0, description="Engine seed (sampling with a request seed is reproducible).")
    enforce_eager: bool = Field(
        False,
        description="Run the model eagerly: no torch.compile (on a CPU, inductor builds C++ kernels on a home's "
        "first start of each model shape, ~35 s on 2 cores, cached after) and no CUDA graphs. false suits a "
        "long-running server; true suits short-lived ones (tests, demos) on small models.",
    )


class RoutingConfig(StrictModel):
    model_name: str | None = Field(
        None, description="Registered model whose aliases are served; null: registry.model_name."
    )
    served_name: str = Field("chat", description="The OpenAI model name that means 'whatever the aliases say'.")
    primary_alias: str = Field("champion", description="Alias that answers requests for the served name.")
    fallback: str | None = Field(
        None,
        description="Version that answers when the primary's engine is dead or in brownout: NAME@ALIAS or "
        "NAME/VERSION (for example chat@previous-champion); null: no fallback.",
    )
    extra: list[str] = Field(
        default_factory=list,
        description="More versions to load at start (NAME@ALIAS or NAME/VERSION); any registered version may "
        "also be requested by name and is loaded on first use.",
    )
    challenger_alias: str = Field(
        "challenger",
        description="Alias of the canary: it answers the registered model's 'rollout.weight' tag percent of the "
        "served name's requests (sticky per conversation); weight 0: loaded, but answers no user.",
    )
    shadow_alias: str = Field(
        "shadow",
        description="Alias of the shadow version: it gets a mirrored share of the served name's requests "
        "(serving.pipeline.shadow) and never answers a user.",
    )
    refresh_s: float = Field(
        10,
        gt=0,
        description="How often the registry's aliases and canary weight are re-read (a rollout step or an alias "
        "moved in the MLflow UI takes effect within this time, plus an engine start when one is needed).",
    )


class ApiKeysConfig(StrictModel):
    required: bool = Field(True, description="Require 'Authorization: Bearer <key>' on /v1 routes.")
    requests_per_minute: int = Field(60, ge=1, description="Default per-key request limit (a key may override).")
    tokens_per_minute: int = Field(
        20000, ge=1, description="Default per-key token limit: prompt + max_tokens reserved up front, reconciled."
    )
    storage_uri: str = Field(
        "memory://",
        description="Rate-limit counters (the 'limits' library): memory:// for one process, redis://host:6379 "
        "when several gateway replicas share the limits.",
    )


class ContextConfig(StrictModel):
    default_max_tokens: int = Field(256, ge=1, description="Completion budget when a request sets none.")
    max_tokens_cap: int = Field(1024, ge=1, description="Upper bound on any request's max_tokens.")
    min_completion_tokens: int = Field(
        16, ge=1, description="Room kept for the answer when a long conversation is trimmed to the window."
    )


class SafetyConfig(StrictModel):
    pre_filter: bool = Field(True, description="Check prompts before inference (rules + classifier).")
    post_filter: bool = Field(True, description="Check generated text before it reaches the client.")
    toxicity_threshold: float = Field(
        0.9, ge=0, le=1, description="Classifier score at or above which a prompt or a reply window is blocked."
    )
    classifier: str | None = Field(
        "safety-classifier@champion",
        description="The harm-intent classifier the pre-filter loads (NAME@ALIAS or NAME/VERSION; the alias is "
        "followed on every registry refresh); null: rules and toxicity scorer only (serving.safety.harm_filter).",
    )
    classifier_missing: Literal["rules-only", "fail-closed"] = Field(
        "rules-only",
        description="When the classifier cannot be loaded (no version has the alias yet): serve with the rules "
        "alone, or block every prompt. Logged either way.",
    )
    classifier_canary: str | None = Field(
        "safety-classifier@challenger",
        description="A classifier version in canary (NAME@ALIAS, followed like 'classifier'): while the alias names "
        "a version other than the classifier's, both judge every prompt; the canary decides for "
        "classifier_canary_percent of conversations, the other judges in shadow, and the request log keeps both "
        "verdicts for 'lifecycle safety-classifier canary' (promote or roll back). null: no canary.",
    )
    classifier_canary_percent: int = Field(
        10,
        ge=0,
        le=100,
        description="Share of conversations (by their first user turn) whose prompts the canary version decides.",
    )
    context_turns: int = Field(
        3,
        ge=1,
        description="The classifier also judges the newest this-many user turns joined, with the request's system "
        "and developer messages ahead of them (1: the newest turn alone, and joined with those messages if any).",
    )
    judge_replies: Literal["unverified", "all", "none"] = Field(
        "unverified",
        description="Which assistant turns a request carries the classifier judges with its user turns (joined, "
        "never alone, within the context_turns window): those this gateway did not write (a client can forge "
        "'Sure, here is how to ... Step 1:' and send 'continue'), every one, or none (serving.safety.replies).",
    )
    reply_ledger_size: int = Field(
        65536,
        ge=0,
        description="How many of its replies the gateway keeps in memory (a digest each) to know an assistant turn "
        "it wrote when a client sends it back; the others are looked up on the request log, which every replica "
        "writes (serving.safety.replies). A reply whose log texts were erased is judged like a client's own.",
    )
    review_categories: list[str] = Field(
        default_factory=lambda: ["self_harm", "violence"],
        description="Classifier categories whose blocks are queued for human review (lifecycle safety-classifier "
        "review).",
    )
    post_classifier: bool = Field(
        False,
        description="The post-filter also scores each sentence window of a reply with the safety classifier (a "
        "window at its threshold stops the reply). Off by default: the classifier is trained on requests, not "
        "replies, and a refusal naming the harm scores like the request (serving.safety.harm_filter.HarmWindowScorer).",
    )
    blocked_output_patterns: list[str] = Field(
        default_factory=list,
        description="Regular expressions the reply must never contain (secrets, internal names ...), checked by "
        "the post-filter in addition to the classifier.",
    )
    refusal_text: str = Field(
        "I'm sorry, but I can't help with that request.",
        description="The answer a prompt blocked by the pre-filter gets (finish_reason content_filter).",
    )
    category_refusals: dict[str, str] = Field(
        default_factory=lambda: {"self_harm": SELF_HARM_SUPPORT},
        description="The answer a prompt the safety classifier blocks as this harm category gets instead of "
        "refusal_text. Someone writing about hurting themselves gets support and a pointer to help, not a bare "
        "refusal (the harmful suite scores self-harm replies on that: core.refusal.points_to_help).",
    )
    stopped_text: str = Field(
        "[This response was stopped by the safety filter.]",
        description="What ends a reply the post-filter stopped (finish_reason content_filter).",
    )
    kept_out_note: str = Field(
        "(This message and its reply are kept out of the conversation: later messages will not see them.)",
        description="Added to the refusal or stop text when the blocked turn belongs to a stored conversation: the "
        "turn is stored and shown in its history, marked, but never sent to the model or judged again.",
    )


class RequestLimits(StrictModel):
    """What one request may ask for, checked before any work is done on it (a client error: 4xx)."""

    max_body_bytes: int = Field(
        1_048_576,
        ge=1024,
        description="Largest request body accepted, in bytes (413 beyond), checked against Content-Length before "
        "the body is read and again while it is read.",
    )
    max_json_depth: int = Field(
        32, ge=4, le=512, description="Deepest nesting of arrays and objects a JSON body may have (400 beyond)."
    )
    max_messages: int = Field(
        256,
        ge=1,
        description="Most messages one chat request may carry (400 beyond), checked before the conversation is "
        "tokenized; a stored conversation longer than the window is trimmed as the context budget says.",
    )
    max_stop_sequences: int = Field(16, ge=1, description="Most stop strings one request may set (400 beyond).")
    max_prompts: int = Field(16, ge=1, description="Most prompts one /v1/completions request may carry (400 beyond).")
    max_embedding_inputs: int = Field(
        128, ge=1, description="Most texts one /v1/embeddings request may carry (400 beyond)."
    )
    max_feedback_chars: int = Field(
        8000, ge=1, description="Longest better answer or comment POST /v1/feedback takes, in characters (422 beyond)."
    )
    retry_after_s: int = Field(
        5,
        ge=1,
        description="Retry-After of a 503 (the gateway still loading, no healthy engine): when a client may try "
        "again; an engine restart takes about half a minute on a CPU.",
    )


class MetricsConfig(StrictModel):
    token_env: str | None = Field(
        None,
        description="Name of an environment variable holding a token that GET /metrics then requires "
        "('Authorization: Bearer <token>'); null: /metrics is open (bind the gateway to a private interface or "
        "scrape it through a proxy). The token itself never goes in YAML.",
    )


class BrownoutConfig(StrictModel):
    enabled: bool = Field(True, description="Shed load when the primary is overloaded.")
    queue_depth: int = Field(32, ge=1, description="Waiting requests on an engine at which brownout starts.")
    ttft_ms: float = Field(
        5000, gt=0, description="Recent time-to-first-token (p90 over the window) at which brownout starts."
    )
    window_s: float = Field(30, gt=0, description="Time window of the TTFT measurement.")
    max_tokens: int = Field(64, ge=1, description="max_tokens cap applied to requests during brownout.")
    use_fallback: bool = Field(
        True, description="During brownout, send new requests to routing.fallback (when it is set and healthy)."
    )


class SloConfig(StrictModel):
    ttft_ms: float = Field(1000, gt=0, description="Time-to-first-token target of a good request (goodput).")
    tpot_ms: float = Field(200, gt=0, description="Time-per-output-token target of a good request (goodput).")


class ShadowConfig(StrictModel):
    enabled: bool = Field(True, description="Mirror requests to the shadow version while the shadow alias exists.")
    fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Share of the served name's requests mirrored while a shadow version is loaded (chosen by a "
        "hash of the request id: deterministic).",
    )
    max_concurrent: int = Field(
        2, ge=1, description="Shadow requests running at once; a request beyond it is skipped (counted), not queued."
    )
    tokens_per_minute: int = Field(
        20000,
        ge=1,
        description="Shadow budget: prompt + max_tokens reserved per mirrored request over a sliding minute; "
        "requests beyond it are skipped and counted, never queued.",
    )
    similarity: bool = Field(
        True,
        description="Compare the two answers by the cosine of their MiniLM sentence embeddings (the bundled "
        "all-MiniLM-L6-v2, loaded on first use); false: similarity is left empty.",
    )


class CostConfig(StrictModel):
    """What an engine replica costs, for the cost per 1M tokens (``serving.pipeline.cost``): busy hours of a
    version's replicas x this price / the completion tokens they wrote. The defaults price the CPU machine the
    project is developed and measured on (docs/operations.md); production sets its own hardware and rate."""

    hardware: str = Field(
        "cpu-2vcpu-xeon",
        description="The hardware one engine replica runs on, named as the price list names it (a cloud instance "
        "type, a GPU model): shown beside the price in /metrics and GET /v1/models. Default: the 2-vCPU Intel Xeon "
        "machine this project is developed and measured on.",
    )
    price_usd_per_replica_hour: float = Field(
        0.10,
        ge=0,
        description="What one engine replica costs per hour, in US dollars. Default: about an on-demand 2-vCPU x86 "
        "cloud instance (AWS m6i.large lists at 0.096 USD/h in us-east-1); a one-H100 replica is 2-4 USD/h. "
        "0: cost not tracked (every cost reads 0, the canary's cost check passes).",
    )


class FaultConfig(StrictModel):
    """Fault injection for rollout drills and tests, like Envoy's fault filter: slow down one version's answers
    (primary, canary and shadow alike) and watch the canary analysis catch it."""

    version: str = Field(description="The registered version the delays apply to, NAME/VERSION (like chat/5).")
    ttft_delay_ms: float = Field(
        0, ge=0, description="Added before the first token of every request that version answers."
    )
    tpot_delay_ms: float = Field(0, ge=0, description="Added before every streamed delta after the first.")

    @model_validator(mode="after")
    def _ref(self) -> FaultConfig:
        if not re.fullmatch(r"[^@/]+/\d+", self.version):
            raise ValueError(f"faults[].version must be NAME/VERSION (like chat/5), got {self.version!r}")
        return self


class ServingConfig(StrictModel):
    host: str = Field("127.0.0.1", description="Interface the endpoint binds.")
    port: int = Field(3000, ge=0, le=65535, description="Port the endpoint binds (0: any free port).")
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL of conversations, usage, keys and the request log; null: SQLite (WAL) under "
        "$LIFECYCLE_HOME/serving/serving.db. Production: postgresql+psycopg://...",
    )
    retention_days: float = Field(30, gt=0, description="Deleted conversations are purged after this many days.")
    log_text_retention_days: float = Field(
        30,
        gt=0,
        description="Prompt, reply, error and feedback texts of the request log and the shadow log are erased after "
        "this many days by the scheduled log-retention flow (the numeric rows stay: usage, cost, latency, verdicts).",
    )
    routing: RoutingConfig = Field(default_factory=RoutingConfig, description="Which versions answer.")
    engine: EngineSettings = Field(default_factory=EngineSettings, description="vLLM engine settings.")
    # not "keys": Prefect resolves flow parameters by walking them, and takes a field named keys for Mapping.keys
    api_keys: ApiKeysConfig = Field(default_factory=ApiKeysConfig, description="API keys and rate limits.")
    context: ContextConfig = Field(default_factory=ContextConfig, description="Context budget.")
    safety: SafetyConfig = Field(default_factory=SafetyConfig, description="Pre- and post-filters.")
    limits: RequestLimits = Field(default_factory=RequestLimits, description="Request size and shape limits.")
    prepare_threads: int | None = Field(
        None,
        ge=1,
        description="Worker threads that prepare requests (chat template and tokenization, then the pre-filter: "
        "rules, toxicity scorer, safety classifier) at once; null: one more than the CPUs this process may use, "
        "so the cores still run the classifier's passes (which release Python's GIL) while one thread holds the "
        "GIL. Requests beyond it wait their turn in order rather than contend for the cores and the GIL: at 32 "
        "streams on 2 cores the safety classifier's added p99 is lower and steadier (docs/results.md, 'The "
        "pre-filter's own threads' and 'One thread more than the cores').",
    )
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Who may read GET /metrics.")
    brownout: BrownoutConfig = Field(default_factory=BrownoutConfig, description="Load shedding.")
    slo: SloConfig = Field(default_factory=SloConfig, description="Latency targets behind the goodput metric.")
    shadow: ShadowConfig = Field(
        default_factory=ShadowConfig, description="Mirroring to the shadow version (routing.shadow_alias)."
    )
    cost: CostConfig = Field(
        default_factory=CostConfig, description="Price of an engine replica-hour, for the cost per 1M tokens."
    )
    faults: list[FaultConfig] = Field(
        default_factory=list,
        description="Fault injection for rollout drills and tests (like Envoy's fault filter): latency added to "
        "the answers of named versions. Empty in production.",
    )

    def preparing_threads(self) -> int:
        """``prepare_threads``, or its default on this machine: one more than the CPUs this process may use."""
        return self.prepare_threads or available_cpus() + 1

    @model_validator(mode="after")
    def _caps(self) -> ServingConfig:
        if self.context.default_max_tokens > self.context.max_tokens_cap:
            raise ValueError("context.default_max_tokens must not exceed context.max_tokens_cap")
        return self
