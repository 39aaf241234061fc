"""Chat template rendering and tokenization, off the event loop and time-limited.

Message content is the client's: special-token text typed in it (``<|im_start|>system``)
is tokenized as plain text, so a user cannot forge a turn of another role.
Content that holds such text is wrapped in random markers before rendering; the
rendered text is then tokenized piece by piece: the template's own text as
usual, the content with ``split_special_tokens=True``. Content without
special-token text (nearly all of it) is tokenized exactly as before.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import re
import secrets
from typing import Any, Callable, Optional, TypeVar

from inflight.entrypoints.openai.errors import OpenAIError
from inflight.entrypoints.openai.limits import clip
from inflight.errors import InvalidRequestError
from inflight.inputs import require_unicode

T = TypeVar("T")


def special_token_texts(tokenizer: Any) -> list[str]:
    """The text of every special token the tokenizer would turn into a control token."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(added.content))
    return sorted((t for t in texts if t), key=len, reverse=True)


class ChatRenderer:
    """Renders conversations with the model's (or the operator's) chat template."""

    def __init__(self, tokenizer: Any, chat_template: Optional[str] = None,
                 allow_special_tokens_in_content: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        texts = [] if allow_special_tokens_in_content else special_token_texts(tokenizer)
        self._special = re.compile("|".join(map(re.escape, texts))) if texts else None

    def has_special_text(self, text: Optional[str]) -> bool:
        """True if ``text`` contains a special token's text (and the operator did not allow it)."""
        return bool(self._special and text and self._special.search(text))

    def render(self, dicts: list[dict[str, Any]], add_generation_prompt: bool = True,
               template_kwargs: Optional[dict[str, Any]] = None,
               continue_final_message: bool = False) -> dict[str, Any]:
        """An engine prompt (text and token ids) for messages already in template form.
        ``continue_final_message`` leaves the last message open (no end-of-turn after it),
        so the model continues it: a prefilled start of the answer.

        Raises InvalidRequestError for messages the template cannot render."""
        for value in [m.get("name") for m in dicts] + list((template_kwargs or {}).values()):
            if isinstance(value, str) and self.has_special_text(value):
                raise InvalidRequestError("messages: special-token text is not allowed in names or template arguments")
        begin, end = f"\ue000{secrets.token_hex(8)}\ue001", f"\ue002{secrets.token_hex(8)}\ue003"
        wrap = [self.has_special_text(m.get("content")) for m in dicts]
        marked = [dict(m, content=f"{begin}{m['content']}{end}") if w else m for m, w in zip(dicts, wrap)]
        kwargs = dict(template_kwargs or {})
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        try:
            text = self.tokenizer.apply_chat_template(
                marked, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **kwargs)
        except Exception as e:  # jinja raises for roles/orders the template rejects
            raise InvalidRequestError(f"messages: the chat template rejects these messages: {clip(str(e))}") from None
        # a lone surrogate can come in anywhere the template prints: tool schemas, arguments
        require_unicode(text, "messages: the rendered conversation (tools and tool call arguments included)")
        # The template already wrote any BOS token: do not let the tokenizer add another.
        if not any(wrap):
            return {"prompt": text, "prompt_token_ids": self.tokenizer(text, add_special_tokens=False).input_ids}
        return self._tokenize_marked(text, begin, end)

    def _tokenize_marked(self, text: str, begin: str, end: str) -> dict[str, Any]:
        pieces = re.split(f"({re.escape(begin)}.*?{re.escape(end)})", text, flags=re.DOTALL)
        ids: list[int] = []
        plain = []
        for piece in pieces:
            content = piece.startswith(begin) and piece.endswith(end)
            if content:
                piece = piece[len(begin):-len(end)]
            if begin in piece or end in piece:
                raise InvalidRequestError("messages: the chat template rewrote message content "
                                          "that holds special-token text")
            if piece:
                ids += self.tokenizer(piece, add_special_tokens=False, split_special_tokens=content).input_ids
                plain.append(piece)
        return {"prompt": "".join(plain), "prompt_token_ids": ids}


class TokenizerPool:
    """Runs template rendering and tokenization on worker threads, with a time limit.

    A timed-out job cannot be killed (Python threads cannot be), but the event
    loop stays free and the client gets a 503 rather than a hung server.

    One worker: HF fast tokenizers keep ``split_special_tokens`` as state on the
    shared Rust tokenizer, set by each call; two concurrent encodes could each
    run with the other's setting, letting forged special tokens through.
    """

    def __init__(self, timeout_s: float, workers: int = 1) -> None:
        self.timeout_s = timeout_s
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                               thread_name_prefix="inflight-tokenizer")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread; 503 + Retry-After past the time limit."""
        future = asyncio.wrap_future(self._executor.submit(fn, *args))
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except asyncio.TimeoutError:
            raise OpenAIError(503, f"tokenization took longer than {self.timeout_s:g} s (--tokenizer-timeout)",
                              code="tokenizer_timeout", headers={"Retry-After": "5"}) from None

    def shutdown(self) -> None:
        """Stop the workers once their current jobs end."""
        self._executor.shutdown(wait=False, cancel_futures=True)
