"""The project's own tokenizer: byte-level BPE (the ``tokenizers`` library) with chat special tokens and a chat
template, saved as a Hugging Face tokenizer that transformers, peft and vLLM load.

Chat format (the template marks assistant turns with ``{% generation %}`` so fine-tuning can compute the loss on
assistant tokens only, through ``return_assistant_tokens_mask``)::

    <|begin_of_text|><|system|>\\n...<|end|>\\n<|user|>\\n...<|end|>\\n<|assistant|>\\n...<|end|>\\n

``<|end|>`` ends a turn and is the tokenizer's EOS, so engines stop there; ``<|end_of_text|>`` separates
pretraining documents.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from core.hashing import sha256_text
from training.config import TokenizerConfig

BOS, DOCUMENT_END, PAD, TURN_END = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, DOCUMENT_END, PAD, TURN_END, *ROLE_TOKENS)

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|assistant|>\\n' -}}{% generation %}{{- message['content'] | trim -}}{{- '<|end|>' -}}{% endgeneration %}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|' + message['role'] + '|>\\n' + (message['content'] | trim) + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig, max_length: int) -> PreTrainedTokenizerFast:
    """Train on ``texts`` and wrap as a Hugging Face fast tokenizer with the chat template set."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if cfg.split_digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=TURN_END,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS) + [DOCUMENT_END],
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def tokenizer_hashes(folder: Path) -> dict[str, str]:
    """Hashes that identify a tokenizer and its chat template (recorded in every lineage)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    template = tok.chat_template if isinstance(tok.chat_template, str) else str(tok.chat_template)
    return {
        "tokenizer_hash": sha256_text("\n".join(f"{i}\t{t}" for t, i in vocab) + "\n" + str(tok.all_special_tokens)),
        "chat_template_hash": sha256_text(template or ""),
    }
