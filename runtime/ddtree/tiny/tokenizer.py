"""Byte-level tokenizer for the tiny models: ids 0..255 are the bytes, then the special tokens.

Built with the `tokenizers` library (BPE over the 256 byte-level symbols with no merges) and saved as a
PreTrainedTokenizerFast, so `AutoTokenizer.from_pretrained(DIR/target)` loads it offline. The chat template is
Qwen-style: `<|im_start|>role\\ncontent<|im_end|>\\n` per message; with `enable_thinking=False` the generation
prompt ends with an empty `<think>\\n\\n</think>\\n\\n` block, as Qwen3 does.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK = "<think>"
END_THINK = "</think>"
MASK = "<|MASK|>"  # the DFlash drafter's mask token (the name SGLang defaults to)

# (token, special): <think> tags are plain added tokens (kept by decode), as in Qwen3.
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    (ENDOFTEXT, True),
    (IM_START, True),
    (IM_END, True),
    (THINK, False),
    (END_THINK, False),
    (MASK, True),
)
TOKEN_IDS: dict[str, int] = {tok: 256 + i for i, (tok, _) in enumerate(SPECIAL_TOKENS)}
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # 262; the models pad their embedding rows to a multiple of 8

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    byte_to_char = bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=special, normalized=False) for t, special in SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        mask_token=MASK,
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(out_dir: Path) -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    tok.save_pretrained(str(out_dir))
    return tok
