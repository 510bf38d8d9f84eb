"""How many token ids the engine's model has: what a prompt's ids must stay below.

SGLang 0.5.23 checks none of a prompt's `input_ids`: one at or above the model's vocabulary size
kills its scheduler (an IndexError in the embedding), and every request it holds fails with it.
So the server refuses such ids at admission, before any money moves, and learns the size, in
this order, from:

* `/model_info`'s `vocab_size`: the emulator states it there (SGLang 0.5.23 states it nowhere);
* the model folder `/model_info` names (`model_path`), when this machine can read its
  `config.json` (`vocab_size`, or `text_config.vocab_size` for a multimodal model): SGLang on
  this host, as `make run-sglang` runs it;
* the local tokenizer's vocabulary, added tokens included (the `tokenizer` setting): a model's
  embedding has at least as many rows as its tokenizer has ids.

When none of them tells, the ids are not checked beyond the schema's bound.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inference_auctions.server.engine.local_tokenizer import LocalTokenizer

__all__ = ["learn_vocab_size"]


def _positive(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _in_model_folder(model_path: Any) -> int | None:
    """`vocab_size` from the model folder's `config.json`, if this machine has it."""
    if not isinstance(model_path, str) or not model_path:
        return None
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # another host's path, a hub name, or no readable config
    if not isinstance(config, dict):
        return None
    text_config = config.get("text_config")
    nested = text_config.get("vocab_size") if isinstance(text_config, dict) else None
    return _positive(config.get("vocab_size")) or _positive(nested)


def learn_vocab_size(
    model_info: Mapping[str, Any] | None, tokenizer: LocalTokenizer | None
) -> int | None:
    """The vocabulary size from the first source that tells (see the module docstring);
    reads a file, so callers on the event loop run it in a thread."""
    info = model_info or {}
    stated = _positive(info.get("vocab_size")) or _in_model_folder(info.get("model_path"))
    if stated is not None:
        return stated
    return tokenizer.vocabulary_size() if tokenizer is not None else None
