"""OpenAI tool calling on the chat route: the request's tools, and what SGLang is asked for.

A chat with `tools` is rendered with them by the served model's chat template, as SGLang's own
chat route renders it (the tools in the shape SGLang hands its templates, assistant calls with
their arguments as JSON objects); its output is steered as SGLang's chat route steers it
without a `--tool-call-parser`, and read as SGLang's parsers read it:

* `none`: the template sees no tools and the answer is plain text;
* `auto` (the default with tools): the template sees every tool, and the answer is read for
  calls in the `<tool_call>{"name": ..., "arguments": ...}</tool_call>` format of Qwen 2.5/3
  and Hermes templates (`server.api.tool_call_parser`);
* `required`, or a named function: a JSON schema constrains the answer to a JSON array of
  `{"name", "parameters"}` objects, calls of the declared tools (of the named one only), as
  SGLang's `get_json_schema_constraint` builds it;
* `parallel_tool_calls: false`: at most one call (`maxItems` 1 under the constraint; under
  `auto`, the first call only).

Nothing here imports the web stack: bodies are checked in worker processes too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    StringConstraints,
    field_validator,
    model_validator,
)

__all__ = [
    "FunctionSpec",
    "MessageToolCall",
    "NamedToolChoice",
    "ToolPlan",
    "ToolSpec",
    "arguments_object",
    "tool_plan",
]

# OpenAI's rule for a function's name; it also keeps names usable in a JSON schema's enum.
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]


_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")


class FunctionSpec(BaseModel):
    """A function a tool declares: its name, what it does, its arguments' JSON schema."""

    model_config = ConfigDict(extra="ignore")

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    # The order the client wrote the fields in: templates render a tool as sent.
    _sent_order: tuple[str, ...] = PrivateAttr(default=_FUNCTION_FIELDS)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        spec = handler(data)
        if isinstance(data, dict) and isinstance(spec, FunctionSpec):
            spec._sent_order = tuple(key for key in data if key in _FUNCTION_FIELDS)
        return spec

    def as_sent(self) -> dict[str, Any]:
        """The function as the client declared it: its known fields, in its order."""
        return {key: getattr(self, key) for key in self._sent_order}


class ToolSpec(BaseModel):
    """One entry of `tools`: only functions exist in OpenAI's chat API."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionSpec


class _ChosenFunction(BaseModel):
    name: FunctionName


class NamedToolChoice(BaseModel):
    """`tool_choice` naming the one function the answer must call."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: _ChosenFunction


class _CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        arguments_object(value)  # a ValueError says what is wrong
        return value


class MessageToolCall(BaseModel):
    """A call an earlier assistant message made, as OpenAI's answer carried it."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: _CalledFunction


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's `arguments` string as the JSON object templates render (SGLang's rule)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        raise ValueError("arguments must be a JSON object encoded as a string") from None
    if not isinstance(value, dict):
        raise ValueError("arguments must be a JSON object encoded as a string")
    return value


@dataclass(frozen=True)
class ToolPlan:
    """What a chat's tool fields ask of the template, the engine and the answer's reader."""

    tools: list[ToolSpec]
    choice: str  # none, auto, required or the named function's name
    named: bool
    parallel: bool

    @property
    def constrained(self) -> bool:
        """Whether the answer is forced to be calls (`required` or a named function)."""
        return self.named or self.choice == "required"

    @property
    def parses(self) -> bool:
        """Whether the answer is read for calls (every choice but `none`)."""
        return bool(self.tools) and self.choice != "none"

    def offered(self) -> list[ToolSpec]:
        """The tools the template shows the model: none for `none`, the named one alone."""
        if not self.tools or self.choice == "none":
            return []
        if self.named:
            return [tool for tool in self.tools if tool.function.name == self.choice]
        return list(self.tools)

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The offered tools as the client declared them (None: none offered); the engine
        shapes them for its template (`server.engine.chat_template.sglang_template_tools`)."""
        offered = self.offered()
        if not offered:
            return None
        return [{"type": "function", "function": tool.function.as_sent()} for tool in offered]

    def names(self) -> frozenset[str]:
        """The names a call may have."""
        return frozenset(tool.function.name for tool in self.offered())

    def json_schema(self) -> str | None:
        """The constraint for `required` or a named function (None otherwise): a JSON array
        of calls, at least one, at most one unless calls may run in parallel."""
        if not self.constrained:
            return None
        items = [_call_schema(tool) for tool in self.offered()]
        schema: dict[str, Any] = {
            "type": "array",
            "minItems": 1,
            "items": items[0] if self.named else {"type": "object", "anyOf": items},
        }
        if not self.parallel:
            schema["maxItems"] = 1
        return json.dumps(schema, separators=(",", ":"), default=float)


def _call_schema(tool: ToolSpec) -> dict[str, Any]:
    parameters = tool.function.parameters or {"type": "object", "properties": {}}
    return {
        "properties": {
            "name": {"type": "string", "enum": [tool.function.name]},
            "parameters": parameters,
        },
        "required": ["name", "parameters"],
    }


def tool_plan(
    tools: list[ToolSpec] | None,
    tool_choice: str | NamedToolChoice | None,
    parallel_tool_calls: bool | None,
) -> ToolPlan | None:
    """The plan for a chat's tool fields (None when they ask for nothing); a `ValueError`
    with the field's name first says what does not fit together."""
    declared = list(tools or [])
    if isinstance(tool_choice, NamedToolChoice):
        name = tool_choice.function.name
        if name not in {tool.function.name for tool in declared}:
            raise ValueError(f"tool_choice: names function {name!r}, which tools does not declare")
        choice, named = name, True
    else:
        choice, named = tool_choice or ("auto" if declared else "none"), False
        if choice == "required" and not declared:
            raise ValueError("tool_choice: 'required' needs at least one tool in tools")
    names = [tool.function.name for tool in declared]
    if len(names) != len(set(names)):
        duplicate = next(name for name in names if names.count(name) > 1)
        raise ValueError(f"tools: function {duplicate!r} is declared twice")
    if not declared:
        return None
    return ToolPlan(declared, choice, named, parallel_tool_calls is not False)
