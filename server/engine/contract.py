"""What SGLang 0.5.23's `/generate` contract says that both sides of it need to know.

The auction server refuses at admission what SGLang would refuse for a request's length, and
the SGLang emulator (`server.emulator`) refuses the same with the same words; both read the
facts here.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "REQUEST_LEVEL_KEYS",
    "ContextTooLong",
    "check_context_length",
    "render_chat",
]

DEFAULT_MAX_NEW_TOKENS = 128
# Request options of SGLang's `/generate` body that the auction server carries with a
# request's sampling parameters; its SGLang backend sends them at the top level.
REQUEST_LEVEL_KEYS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_text_in_logprobs",
)


class ContextTooLong(ValueError):
    """The request does not fit the model's context; `field` is the part to shorten."""

    def __init__(self, message: str, field: Literal["prompt", "max_new_tokens"]) -> None:
        super().__init__(message)
        self.field = field


def check_context_length(prompt_tokens: int, max_new_tokens: object, context_length: int) -> None:
    """Refuse what SGLang 0.5.23's tokenizer manager refuses for the request's length.

    The prompt must be shorter than the context, and the prompt plus an explicit
    `max_new_tokens` too; the messages are SGLang's (a ValueError, which it answers with 400).
    Raises `ContextTooLong`, naming the part of the request to shorten.
    """
    if prompt_tokens >= context_length:
        raise ContextTooLong(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context_length} tokens).",
            "prompt",
        )
    if isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool):
        total = max_new_tokens + prompt_tokens
        if total >= context_length:
            raise ContextTooLong(
                "Requested token count exceeds the model's maximum context length of "
                f"{context_length} tokens. You requested a total of {total} tokens: "
                f"{prompt_tokens} tokens from the input messages and {max_new_tokens} tokens "
                "for the completion. Please reduce the number of tokens in the input messages "
                "or the completion to fit within the limit.",
                "max_new_tokens",
            )


def render_chat(messages: list[tuple[str, str]]) -> str:
    """The plain chat template: the emulator's own, and the transcript sent to an SGLang whose
    `/tokenize` cannot render a conversation itself (`<|role|>` lines, then the assistant's)."""
    blocks = [f"<|{role}|>\n{content}\n" for role, content in messages]
    return "".join(blocks) + "<|assistant|>\n"
