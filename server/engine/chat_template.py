"""A model's chat template, rendered in this process as transformers renders it for SGLang.

SGLang turns a chat into a prompt with the model's own template: the Jinja source under
`chat_template` in the model folder's `tokenizer_config.json` (or `chat_template.jinja` beside
it), rendered by transformers' `apply_chat_template` in a sandboxed Jinja environment with
`trim_blocks` and `lstrip_blocks`, the messages, `add_generation_prompt=True` and the
tokenizer's special tokens as variables. Rendering it here spares the engine a `/tokenize`
round trip per chat. The SGLang backend compares what this gives with the engine's own
rendering before it uses it (`server.engine.sglang_http`), so a template this module renders
differently is never used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["ChatTemplate", "ChatTemplateError", "load_chat_template", "sglang_template_tools"]

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


class ChatTemplateError(ValueError):
    """The model folder's chat template cannot be read or compiled."""


def _raise_exception(message: str) -> None:
    # Templates call it to refuse a conversation they cannot render (a role out of order).
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
    # transformers replaces Jinja's `tojson`, which escapes HTML characters, by plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


class ChatTemplate:
    """One compiled chat template and the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        try:
            from jinja2 import TemplateError  # noqa: PLC0415  (only with a local template)
            from jinja2.ext import loopcontrols  # noqa: PLC0415
            from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415
        except ImportError:
            raise ChatTemplateError("rendering chat templates needs jinja2") from None
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        try:
            self._template = environment.from_string(source)
        except TemplateError as error:
            raise ChatTemplateError(f"the chat template does not compile: {error}") from None
        self._special = dict(special_tokens)

    def render(self, messages: list[tuple[str, str]]) -> str:
        """The prompt of (role, content) messages, ending with the assistant's turn opened."""
        conversation = [{"role": role, "content": content} for role, content in messages]
        return self.render_messages(conversation, None)

    def render_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str:
        """The prompt of OpenAI-shaped messages (an assistant's `tool_calls`, a tool's
        answer) and the tools offered as the client declared them (None: none), as SGLang
        passes them to transformers."""
        try:
            return self._template.render(
                messages=messages,
                tools=sglang_template_tools(tools),
                add_generation_prompt=True,
                **self._special,
            )
        except ChatTemplateError:
            raise
        except Exception as error:  # a template that cannot walk these messages, say
            raise ChatTemplateError(f"the chat template failed: {error}") from None


def sglang_template_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """`tools` as SGLang 0.5.23 hands them to a chat template: each its `Tool` model dumped,
    the function's fields in the order the client sent them, unset `description` and
    `parameters` after them as nulls, unset `strict` left out, and the tool's own
    `defer_loading` null. Templates that `tojson` a tool (Qwen's do) render the same prompt
    here as at the engine only with the same dictionaries."""
    if not tools:
        return None
    shaped = []
    for tool in tools:
        function = {k: v for k, v in tool["function"].items() if k != "strict" or v is not None}
        for key in ("description", "name", "parameters"):
            function.setdefault(key, None)
        shaped.append({"type": "function", "function": function, "defer_loading": None})
    return shaped


def _token_text(value: Any) -> str | None:
    """A special token as `tokenizer_config.json` writes it: a string or an added token."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def load_chat_template(folder: Path) -> ChatTemplate | None:
    """The chat template of the model folder `folder`; None when it has none."""
    config_file = folder / "tokenizer_config.json"
    try:
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except (OSError, ValueError) as error:
        raise ChatTemplateError(f"{config_file} cannot be read: {error}") from None
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the one called "default"
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        source = named.get("default")
    jinja_file = folder / "chat_template.jinja"
    if not isinstance(source, str) and jinja_file.is_file():
        source = jinja_file.read_text()
    if not isinstance(source, str):
        return None
    special = {name: text for name in _SPECIAL_TOKENS if (text := _token_text(config.get(name)))}
    return ChatTemplate(source, special)
