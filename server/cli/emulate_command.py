"""`inference-auction emulate-sglang`: serve the SGLang emulator alone, over SGLang's HTTP API.

It is not SGLang: no model runs. It lets the SGLang backend, `bench_serving` or any SGLang client
be tried without a GPU against the same contract a real server has.
"""

from __future__ import annotations

import logging

import click

from inference_auctions.server.emulator.cost_model import CostModel
from inference_auctions.server.emulator.live import DEFAULT_MODEL_NAME
from inference_auctions.server.emulator.simulator import (
    DEFAULT_CACHE_TOKENS,
    DEFAULT_CHUNKED_PREFILL_SIZE,
)

_COST = CostModel()


@click.command("emulate-sglang")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=30000, show_default=True, help="Port to listen on.")
@click.option(
    "--cache-tokens",
    default=DEFAULT_CACHE_TOKENS,
    show_default=True,
    help="KV cache capacity in tokens (a 32B model on one 80 GB H100 leaves about 23k).",
)
@click.option(
    "--time-scale",
    default=1.0,
    show_default=True,
    help="Wall-clock seconds per model second (0.01 runs 100x faster; meta_info stays in "
    "model seconds).",
)
@click.option(
    "--prefill-ms-per-token",
    default=_COST.prefill_seconds_per_token * 1e3,
    show_default=True,
    help="Prefill time per uncached prompt token.",
)
@click.option(
    "--prefill-ms-per-step",
    default=_COST.prefill_seconds_per_step * 1e3,
    show_default=True,
    help="Fixed time of one prefill step.",
)
@click.option(
    "--decode-ms-per-step",
    default=_COST.decode_seconds_per_step * 1e3,
    show_default=True,
    help="Fixed time of one decode step (reading the weights).",
)
@click.option(
    "--decode-us-per-context-token",
    default=_COST.decode_seconds_per_context_token * 1e6,
    show_default=True,
    help="Decode step time per token of KV held by the running requests.",
)
@click.option(
    "--chunked-prefill-size",
    default=DEFAULT_CHUNKED_PREFILL_SIZE,
    show_default=True,
    help="Most uncached tokens per prefill step, as SGLang's option of that name.",
)
@click.option(
    "--max-running-requests", type=int, help="Cap on running requests (memory bounds it)."
)
@click.option(
    "--priority-scheduling/--no-priority-scheduling",
    default=True,
    show_default=True,
    help="As SGLang's --enable-priority-scheduling; without it, arrival order only.",
)
@click.option(
    "--low-priority-values-first/--high-priority-values-first",
    default=True,
    show_default=True,
    help="As SGLang's --schedule-low-priority-values-first.",
)
@click.option("--model-name", default=DEFAULT_MODEL_NAME, show_default=True)
@click.option(
    "--api-key",
    envvar="SGLANG_API_KEY",
    help="As SGLang's --api-key: every route but /health* and /metrics wants "
    "'Authorization: Bearer <key>' (also read from SGLANG_API_KEY).",
)
@click.option("--log-level", default="info", show_default=True)
def emulate_sglang(
    host: str,
    port: int,
    cache_tokens: int,
    time_scale: float,
    prefill_ms_per_token: float,
    prefill_ms_per_step: float,
    decode_ms_per_step: float,
    decode_us_per_context_token: float,
    chunked_prefill_size: int,
    max_running_requests: int | None,
    priority_scheduling: bool,
    low_priority_values_first: bool,
    model_name: str,
    api_key: str | None,
    log_level: str,
) -> None:
    """Serve an SGLang EMULATOR (not SGLang) with SGLang's HTTP API.

    It models an H100 serving a 32B model: a radix cache of --cache-tokens with LRU eviction,
    SGLang's FCFS scheduler with priority scheduling and continuous batching, and a cost model
    of prefill and decode time (docs/ENGINE.md). Completions are deterministic words.
    """
    # Imported late: --help should not load the web stack.
    import uvicorn  # noqa: PLC0415

    from inference_auctions.server.emulator.live import LiveSimulator  # noqa: PLC0415
    from inference_auctions.server.emulator.sglang_app import create_sglang_app  # noqa: PLC0415
    from inference_auctions.server.emulator.simulator import EngineSimulator  # noqa: PLC0415

    try:
        cost = CostModel(
            prefill_seconds_per_token=prefill_ms_per_token / 1e3,
            prefill_seconds_per_step=prefill_ms_per_step / 1e3,
            decode_seconds_per_step=decode_ms_per_step / 1e3,
            decode_seconds_per_context_token=decode_us_per_context_token / 1e6,
        )
        simulator = EngineSimulator(
            cache_tokens=cache_tokens,
            cost_model=cost,
            chunked_prefill_size=chunked_prefill_size,
            max_running_requests=max_running_requests,
            priority_scheduling=priority_scheduling,
            low_priority_values_first=low_priority_values_first,
        )
        live = LiveSimulator(simulator, time_scale=time_scale, model_name=model_name)
    except ValueError as error:
        raise click.BadParameter(str(error)) from error
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    click.echo(
        f"SGLang EMULATOR (not SGLang: no model runs) on http://{host}:{port}, "
        f"cache {cache_tokens} tokens, time scale {time_scale:g}"
    )
    app = create_sglang_app(live, api_key=api_key)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
