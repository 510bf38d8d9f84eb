"""Real servers for the engine tests: an ASGI app under uvicorn on a free local port; and a real
Hugging Face tokenizer.json, trained here, for the local tokenizer's tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.sglang_app import create_sglang_app
from inference_auctions.server.emulator.simulator import EngineSimulator
from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine
from tests.processes import free_port


class PathCounter:
    """ASGI middleware that counts the HTTP requests per path."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.paths: Counter[str] = Counter()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths[scope["path"]] += 1
        await self.app(scope, receive, send)


@contextmanager
def serve(app: Any, **options: Any) -> Iterator[str]:
    """Run `app` under uvicorn in a thread; yields its base URL and stops it on exit. With
    `ssl_certfile` and `ssl_keyfile` among `options`, it serves https; `port` picks the port."""
    port = options.pop("port", None) or free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        http="h11",
        ws="none",
        timeout_graceful_shutdown=5,
        **options,
    )
    scheme = "https" if "ssl_certfile" in options else "http"
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive(), "the test server did not stop"


class _Together:
    """ASGI middleware that holds the first `count` `/generate` requests until all of them have
    arrived: they are then in flight at once, on `count` connections, however slow the client."""

    def __init__(self, app: Any, count: int) -> None:
        self.app = app
        self.left = count
        self.arrived: asyncio.Event | None = None  # made on the server's own event loop

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/generate" and self.left > 0:
            if self.arrived is None:
                self.arrived = asyncio.Event()
            self.left -= 1
            if self.left == 0:
                self.arrived.set()
            await self.arrived.wait()
        await self.app(scope, receive, send)


@contextmanager
def emulator(
    time_scale: float = 0.01, together: int = 0, **simulator: Any
) -> Iterator[tuple[str, PathCounter]]:
    """The SGLang emulator app on a free port, with its per-path request counts; the first
    `together` generations wait for each other before any is served."""
    live = LiveSimulator(EngineSimulator(**simulator), time_scale=time_scale)
    app = PathCounter(create_sglang_app(live))
    with serve(_Together(app, together) if together else app) as url:
        yield url, app


_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world , numbers 12345 and symbols !",
    "a prompt about the capital of a country",
]


def word_level_tokenizer(folder: Path, *, bos: bool) -> Path:
    """A word-level tokenizer.json trained into `folder`, adding `<s>` in front when `bos`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>"])
    tokenizer.train_from_iterator(_CORPUS, trainer)
    if bos:
        bos_id = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", bos_id)]
        )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@asynccontextmanager
async def started_engine(url: str, **options: Any) -> AsyncIterator[SGLangHTTPEngine]:
    """An SGLang backend on `url`, started for the block and closed after it."""
    engine = SGLangHTTPEngine(url, **options)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()
