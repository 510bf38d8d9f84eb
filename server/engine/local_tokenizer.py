"""Tokenizing prompts in the auction server's own process instead of at the engine.

In front of a separate SGLang server, the SGLang backend asks its `/tokenize` for every prompt
it has not cached: one more HTTP round trip per request. The `tokenizer` setting can replace it
with a tokenizer here:

* `engine` (the default): no local tokenizer; the engine's `/tokenize` answers.
* `auto`: the engine's own tokenizer, from the `tokenizer_path` of its `/model_info` when that
  folder is readable from this host (and the `tokenizers` library is installed), with the
  model's chat template rendered here (`server.engine.chat_template`); else, as `engine`, with
  the reason logged once. A tokenizer or template that disagrees with the engine's on the
  probes is not used (the engine's `/tokenize` is, and the reason logged) rather than fail.
* `builtin`: the project's offline tokenizer (`server.engine.builtin_tokenizer`). It is the
  tokenizer of the SGLang emulator (`emulate-sglang`), whose `/tokenize` adds no special tokens
  whatever
  `add_special_tokens` says; so is this one.
* a path to a Hugging Face `tokenizer.json`, or to a model folder holding one: loaded with the
  `tokenizers` library (the `tokenizers` extra), encoding with the same `add_special_tokens`
  the backend sends to `/tokenize`. SGLang's tokenizer is the same file, but a model's
  `tokenizer_config.json` can change what transformers adds around it (a BOS, say): the
  comparison below is what catches that.

A local tokenizer that disagrees with the engine's would silently corrupt every request, so the
backend compares the two on `PROBE_TEXTS` before it relies on the local one
(`tokenizer_disagreement`) and refuses to serve with a `TokenizerMismatch`
(`server.engine.errors`) if they differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from inference_auctions.server.engine import builtin_tokenizer
from inference_auctions.server.engine.errors import TokenizerMismatch

__all__ = [
    "AUTO",
    "BUILTIN",
    "CHAT_PROBES",
    "ENGINE",
    "INLINE_TOKENIZE_CHARS",
    "PROBE_TEXTS",
    "TOOL_CHAT_PROBE",
    "BuiltinTokenizer",
    "HuggingFaceTokenizer",
    "LocalTokenizer",
    "TokenizerMismatch",
    "TokenizerSetupError",
    "check_tokenizer_setting",
    "load_tokenizer",
    "tokenizer_disagreement",
    "tokenizer_file",
]

ENGINE = "engine"
BUILTIN = "builtin"
AUTO = "auto"

# Texts longer than this are tokenized in a worker thread. At this length the builtin tokenizer
# takes about half a millisecond (a Rust one less): beyond it every other request on the event
# loop would stall for longer than a request's whole CPU budget. Below it, the hand-off to a
# thread (about 0.1 ms) costs more than it spares.
INLINE_TOKENIZE_CHARS = 8_000

# What the engine and the local tokenizer must agree on: plain words, a leading space, digits,
# punctuation, runs of whitespace and newlines, non-ASCII text and an emoji (byte fallback), and
# text that looks like special tokens. Where `add_special_tokens` adds a BOS, every probe shows it.
PROBE_TEXTS: tuple[str, ...] = (
    "a",
    "Hello, world!",
    " The quick brown fox jumps over the lazy dog.",
    "Numbers 12345 and 3.14159; symbols: #@$%^&*()[]{}<>=+-_/\\|~`",
    "Line one\nLine two\n\n\tindented  double  spaces   ",
    "Grüße aus Köln, naïve café, 東京都, привет, مرحبا 🙂",
    "<s></s><|endoftext|><|im_start|>user [INST] <<SYS>>",
)


# The chats a locally rendered chat template must render to the engine's ids: a lone user turn,
# a system prompt, and several turns with non-ASCII text.
CHAT_PROBES: tuple[list[tuple[str, str]], ...] = (
    [("user", "Hello, world!")],
    [("system", "You are brief."), ("user", "Name three rivers.")],
    [("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Grüße 🙂 and 12345")],
)


# A chat with a tool offered, a call made and its result: a template that renders tools must
# render it to the engine's ids before chats with tools are rendered here.
TOOL_CHAT_PROBE: tuple[list[dict[str, Any]], list[dict[str, Any]]] = (
    [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",  # not None: a template without tool support renders it too
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": '{"celsius": 21}', "tool_call_id": "call_0"},
    ],
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ],
)


class TokenizerSetupError(ValueError):
    """The `tokenizer` setting names nothing that can be loaded."""


class LocalTokenizer(Protocol):
    """A tokenizer that runs in this process; `encode` must be safe to call from a thread."""

    description: str

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """The token ids of `text`, as the engine's `/tokenize` would answer them."""

    def vocabulary_size(self) -> int:
        """How many ids it has, added tokens included."""


class BuiltinTokenizer:
    """The project's offline tokenizer, which the SGLang emulator serves."""

    description = "builtin"

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """`server.engine.builtin_tokenizer.encode`; it has no special tokens to add."""
        return builtin_tokenizer.encode(text)

    def vocabulary_size(self) -> int:
        """`server.engine.builtin_tokenizer.VOCABULARY_SIZE`."""
        return builtin_tokenizer.VOCABULARY_SIZE


class HuggingFaceTokenizer:
    """A Hugging Face `tokenizer.json`, run by the `tokenizers` library."""

    def __init__(self, path: Path) -> None:
        file = tokenizer_file(path)
        tokenizer_class = _tokenizer_class()
        try:
            self._tokenizer: Any = tokenizer_class.from_file(str(file))
        except Exception as error:  # the library raises plain Exceptions for a bad file
            raise TokenizerSetupError(
                f"--tokenizer {str(file)!r} is not a tokenizer.json the `tokenizers` library "
                f"can read: {error}"
            ) from None
        self.description = str(file)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """The ids of `text`, special tokens added by the file's post-processor if asked."""
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def vocabulary_size(self) -> int:
        """The file's vocabulary with its added tokens."""
        size: int = self._tokenizer.get_vocab_size(with_added_tokens=True)
        return size


def tokenizer_file(path: Path) -> Path:
    """The `tokenizer.json` that `path` names, itself or inside a model folder."""
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise TokenizerSetupError(
            f"--tokenizer {str(path)!r}: no such file; give 'auto', 'engine', 'builtin', a "
            "tokenizer.json or a model folder that holds one"
        )
    return file


def _tokenizer_class() -> Any:
    """`tokenizers.Tokenizer`, imported only when a tokenizer.json is used."""
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415  (an optional extra)
    except ImportError:
        raise TokenizerSetupError(
            "--tokenizer with a tokenizer.json needs the `tokenizers` library: install the "
            "extra, pip install 'inference-auctions[tokenizers]'"
        ) from None
    return Tokenizer


def check_tokenizer_setting(setting: str) -> None:
    """Fail early, without loading anything large, if `setting` cannot be loaded."""
    if setting not in (ENGINE, BUILTIN, AUTO):
        tokenizer_file(Path(setting).expanduser())
        _tokenizer_class()


def load_tokenizer(setting: str) -> LocalTokenizer | None:
    """The local tokenizer the `tokenizer` setting names; None for `engine`, and for `auto`,
    whose tokenizer the SGLang backend learns from the engine at start."""
    if setting in (ENGINE, AUTO):
        return None
    if setting == BUILTIN:
        return BuiltinTokenizer()
    return HuggingFaceTokenizer(Path(setting).expanduser())


def tokenizer_disagreement(
    encode: Callable[[str], Sequence[int]], engine_ids: dict[str, Sequence[int]]
) -> str | None:
    """Where `encode` and the engine's answers part, in words; None when they agree."""
    for text, expected in engine_ids.items():
        local = list(encode(text))
        if local != list(expected):
            return (
                f"on {text!r} the local tokenizer gives {_shown(local)} but the engine's "
                f"/tokenize gives {_shown(list(expected))}"
            )
    return None


def _shown(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 12 else f"{str(ids[:12])[:-1]}, ... ({len(ids)} ids)]"
