"""Chat messages to prompt token ids through the tokenizer's chat template.

Tokenizers without a template (the tiny test models may have none) get a Qwen-style ChatML fallback that
honours ``enable_thinking`` the way Qwen3.5/3.6 templates do: thinking on opens ``<think>`` in the prompt,
thinking off closes an empty block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddtree.serve.protocol import ChatMessage, RequestError

FALLBACK_TEMPLATE = (
    "{%- for m in messages -%}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "<think>\n\n</think>\n\n"
    "{%- else -%}"
    "<think>\n"
    "{%- endif -%}"
    "{%- endif -%}"
)


def render_chat(tokenizer: Any, messages: Sequence[ChatMessage], kwargs: Mapping[str, Any]) -> list[int]:
    """Prompt token ids for ``messages`` (template text tokenized without extra special tokens)."""
    template = None if getattr(tokenizer, "chat_template", None) else FALLBACK_TEMPLATE
    reserved = {"messages", "tokenize", "add_generation_prompt", "chat_template", "conversation"}
    bad = reserved.intersection(kwargs)
    if bad:
        raise RequestError(f"chat_template_kwargs must not set {sorted(bad)}", "chat_template_kwargs")
    try:
        text = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
            **dict(kwargs),
        )
    except Exception as exc:  # jinja raise_exception() in templates: a client error, not a crash
        raise RequestError(f"chat template failed: {exc}", "messages") from None
    return list(tokenizer.encode(text, add_special_tokens=False))
