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


def final_assistant(messages: Sequence[ChatMessage], continue_final: bool) -> tuple[list[ChatMessage], str | None]:
    """SGLang 0.5.23's ``_handle_last_assistant_message``: a trailing assistant message is, with
    ``continue_final_message``, taken out and returned as the prefix the reply continues; without it, sent to
    the template as a user message (so the prompt always ends with a new assistant turn)."""
    msgs = list(messages)
    if not msgs or msgs[-1].role != "assistant":
        return msgs, None
    if continue_final:
        return msgs[:-1], msgs[-1].content
    msgs[-1] = ChatMessage(role="user", content=msgs[-1].content)
    return msgs, None


def render_chat(
    tokenizer: Any, messages: Sequence[ChatMessage], kwargs: Mapping[str, Any], continue_final: bool = False
) -> list[int]:
    """Prompt token ids for ``messages`` (template text tokenized without extra special tokens); a final
    assistant message handled as ``final_assistant`` says, its prefix appended as SGLang appends it."""
    messages, prefix = final_assistant(messages, continue_final)
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
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if prefix:  # SGLang: tokenizer.encode(prefix) without a leading BOS
        extra = list(tokenizer.encode(prefix))
        if extra and extra[0] == getattr(tokenizer, "bos_token_id", None):
            extra = extra[1:]
        ids += extra
    return ids
