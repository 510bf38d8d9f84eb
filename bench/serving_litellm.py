"""LiteLLM's proxy as the serving benchmark's peer gateway, in a virtualenv of its own.

LiteLLM is never a dependency of this project: the first run creates `.bench-venvs/litellm`
(git-ignored) with `pip install 'litellm[proxy]'` (a few minutes) and later runs reuse it. The
proxy gets a config that routes one model name to the emulator's OpenAI-compatible
`/v1/chat/completions` through LiteLLM's OpenAI-compatible provider, a random master key (which
it requires), no database and one worker.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

MODEL_NAME = "emulated"
VENV = Path(".bench-venvs/litellm")


def ensure_venv(root: Path) -> Path:
    """The `litellm` executable of the benchmark's virtualenv, installing it on first use."""
    venv = root / VENV
    executable = venv / "bin" / "litellm"
    if executable.exists():
        return executable
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "litellm[proxy]"], check=True)
    if not executable.exists():
        raise RuntimeError(f"installing litellm[proxy] left no {executable}")
    return executable


def master_key() -> str:
    """A fresh master key: LiteLLM wants the `sk-` prefix; 40 random hex characters follow."""
    return "sk-" + secrets.token_hex(20)


def write_config(folder: Path, emulator_url: str, served_model: str, key: str) -> Path:
    """The proxy's config: `MODEL_NAME` -> the emulator's OpenAI routes, no database.

    JSON is valid YAML, so no YAML writer is needed.
    """
    config = {
        "model_list": [
            {
                "model_name": MODEL_NAME,
                "litellm_params": {
                    "model": f"openai/{served_model}",
                    "api_base": f"{emulator_url}/v1",
                    "api_key": "unused",
                },
            }
        ],
        "general_settings": {"master_key": key},
        "litellm_settings": {"telemetry": False, "drop_params": True},
    }
    path = folder / "litellm.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def command(executable: Path, config: Path, port: int) -> list[str]:
    """The proxy's command line: one worker on 127.0.0.1:`port`."""
    return [
        str(executable),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]


# No network from the proxy: the bundled model-cost map, no telemetry, quiet logs.
ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
    "LITELLM_TELEMETRY": "False",
}
