"""Choosing the engine: a real SGLang server when a URL is given, else the embedded emulator."""

from __future__ import annotations

import ssl
from typing import cast

from inference_auctions.server.emulator.cost_model import CostModel
from inference_auctions.server.emulator.embedded import EmbeddedEngine
from inference_auctions.server.emulator.live import DEFAULT_MODEL_NAME
from inference_auctions.server.emulator.simulator import DEFAULT_CACHE_TOKENS
from inference_auctions.server.engine.local_tokenizer import LocalTokenizer
from inference_auctions.server.engine.protocol import DispatchMode, Engine
from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine

__all__ = ["make_engine"]


def make_engine(
    engine_url: str | None,
    mode: str = "priority",
    *,
    timeout: float | None = 600.0,
    cache_tokens: int = DEFAULT_CACHE_TOKENS,
    time_scale: float = 1.0,
    cost_model: CostModel | None = None,
    model_name: str = DEFAULT_MODEL_NAME,
    api_key: str | None = None,
    ca_bundle: str | None = None,
    tokenizer: LocalTokenizer | None = None,
    max_running_requests: int | None = None,
    vocab_size: int | None = None,
    learn_tokenizer: bool = False,
) -> Engine:
    """The SGLang backend at `engine_url` in `mode`, or the embedded emulator without a URL.

    `timeout` bounds one request at SGLang (None: no bound); `api_key` is sent as SGLang's
    `--api-key` expects it (a bearer token); `ca_bundle`, a PEM file, holds the certificate
    authorities an `https://` URL is checked against (default: the system's); `tokenizer`,
    when given, tokenizes prompts for SGLang in this process (`server.engine.local_tokenizer`);
    `vocab_size`, when given, is the model's, instead of learning it
    (`server.engine.vocabulary`); `learn_tokenizer` (`--tokenizer auto`) loads the engine's own
    tokenizer and chat template at start when they are readable here. The emulator options
    apply only without a URL, and the emulator ignores `mode` (it honours priorities itself)
    and `tokenizer` (it tokenizes in process already).
    """
    if mode not in ("priority", "ordered"):
        raise ValueError(f"engine mode must be 'priority' or 'ordered', got {mode!r}")
    if engine_url is None:
        return EmbeddedEngine(
            cache_tokens=cache_tokens,
            cost_model=cost_model,
            time_scale=time_scale,
            model_name=model_name,
            max_running_requests=max_running_requests,
        )
    return SGLangHTTPEngine(
        engine_url,
        mode=cast(DispatchMode, mode),
        request_timeout=timeout,
        api_key=api_key,
        ssl_context=engine_ssl_context(engine_url, ca_bundle),
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        learn_tokenizer=learn_tokenizer,
    )


def engine_ssl_context(engine_url: str, ca_bundle: str | None) -> ssl.SSLContext | None:
    """The TLS context of an `https://` engine URL: certificates and host names checked,
    against `ca_bundle` when given (a `ValueError` names a bundle that cannot be read)."""
    if ca_bundle is None or not engine_url.startswith("https://"):
        return None  # plain HTTP, or the client's default: the system's authorities
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(
            f"engine_ca_bundle {ca_bundle!r} cannot be read as PEM certificates: {error}"
        ) from None
