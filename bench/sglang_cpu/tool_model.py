"""The tiny model with a chat template that renders tools, as Qwen 2.5's does.

    python -m bench.sglang_cpu.tool_model SOURCE TARGET

copies the model folder SOURCE (what `make_model.py` writes) to TARGET with `TOOL_TEMPLATE` as
its `chat_template.jinja`. It renders a chat without tools as the plain ChatML template does
(the same ids), and with tools it shows them in the system turn inside `<tools></tools>` and
asks for calls as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`; an assistant's
calls and the tools' results (`<tool_response>` in a user turn) render as Qwen 2.5's template
renders them (SGLang's `qwen25` tool-call parser reads that format).

A copy rather than a change to the shared model: every other test's prompts stay what they are.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

__all__ = ["TOOL_TEMPLATE", "make_tool_model"]

TOOL_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}
{{- messages[0]['content'] + '\\n\\n' }}
{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' }}{{- tool | tojson }}
{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and loop.first and tools %}
{%- elif message['role'] == 'assistant' and message['tool_calls'] %}
{{- '<|im_start|>assistant' }}
{%- if message['content'] %}
{{- '\\n' + message['content'] }}
{%- endif %}
{%- for tool_call in message['tool_calls'] %}
{%- set call = tool_call['function'] %}
{{- '\\n<tool_call>\\n{"name": "' + call['name'] + '", "arguments": ' }}
{{- call['arguments'] | tojson }}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message['role'] == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def make_tool_model(source: Path, target: Path) -> Path:
    """TARGET: the model folder SOURCE with `TOOL_TEMPLATE` as its chat template."""
    shutil.copytree(source, target, dirs_exist_ok=True)
    (target / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return target


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m bench.sglang_cpu.tool_model SOURCE TARGET")
    print(make_tool_model(Path(sys.argv[1]), Path(sys.argv[2])))


if __name__ == "__main__":
    main()
