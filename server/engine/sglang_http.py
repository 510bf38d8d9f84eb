"""The SGLang backend: an unmodified SGLang server reached over HTTP.

Requests go out in dispatch order, across batches, from one sender. Two ways to keep the
auction's order (`mode`):

* `priority` (the default) sends each request with `priority` = its global schedule sequence
  number, and sends the next as soon as this one's body is on the wire, so a whole batch
  reaches SGLang at once and in order. A streamed request with an idle keep-alive connection
  at hand is written by the sender itself, before the task that reads its answer starts: a
  batch then goes out in one turn of the event loop, not one request per turn. The SGLang
  server must run with `--schedule-policy fcfs --enable-priority-scheduling
  --schedule-low-priority-values-first`; it then admits waiting requests by that number, so a
  later batch never overtakes an earlier one.
* `ordered` serves a server started without priority scheduling: request k+1 is sent only once
  request k's stream has produced its first event (SGLang admitted it and ran its prefill). It
  always streams internally, and sends no `priority`.

Prompts are tokenized with the server's `/tokenize`, or, with a local tokenizer
(`server.engine.local_tokenizer`, the `tokenizer` setting), in this process: inline for a short
text, in a worker thread for a long one. Either way the ids are cached per distinct text in a
bounded LRU, and concurrent calls for one text share a single request or thread. A local
tokenizer is first compared with the server's `/tokenize` on a few probe texts: at `start` if
the server answers then (a disagreement there fails the start), else before the first prompt is
tokenized (single-flight; an unreachable server fails that prompt as `/tokenize` would, and the
next prompt tries again). A disagreement is a `TokenizerMismatch` for every prompt after it.

Failures map to the `server.engine.errors` hierarchy: no connection or a 503 -> `EngineUnavailable`,
a deadline -> `EngineTimeout`, a 4xx -> `EngineRejected`, a 5xx or an abort -> `EngineServerError`,
an unreadable body or a stream cut before its last chunk -> `EngineProtocolError`. SGLang 0.5.23
answers bad input in three shapes (`{"error": "text"}` from its JSON contract check, `{"error":
{"message": ...}}`, and `{"message": ...}` or `{"detail": ...}` for HTTP exceptions); all are read.

HTTP goes through `server.engine.http_client`, a small keep-alive client made for the serving
path's CPU budget; the request deadline covers connecting, queueing at SGLang and every chunk.
Token ids are cached as read-only numpy arrays (int32 while the ids fit): `tokenize_array`
hands out the cached array itself, `tokenize` a fresh list.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from inference_auctions.server.engine.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    load_chat_template,
)
from inference_auctions.server.engine.errors import (
    ChatRefused,
    EngineError,
    EngineProtocolError,
    EngineRejected,
    EngineServerError,
    EngineTimeout,
    EngineUnavailable,
)
from inference_auctions.server.engine.http_client import (
    DeadlineExceeded,
    HTTPClient,
    HTTPClientError,
    HTTPTimeout,
    StreamRequest,
)
from inference_auctions.server.engine.local_tokenizer import (
    CHAT_PROBES,
    INLINE_TOKENIZE_CHARS,
    PROBE_TEXTS,
    TOOL_CHAT_PROBE,
    HuggingFaceTokenizer,
    LocalTokenizer,
    TokenizerMismatch,
    TokenizerSetupError,
    tokenizer_disagreement,
)
from inference_auctions.server.engine.protocol import (
    REQUEST_LEVEL_KEYS,
    DispatchMode,
    EngineBase,
    EngineChunk,
    EngineRequest,
    EngineResult,
    Generation,
    TokenArray,
    render_chat,
)
from inference_auctions.server.engine.vocabulary import learn_vocab_size

__all__ = ["SGLangHTTPEngine"]

log = logging.getLogger(__name__)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _error_message(body: bytes, status: int) -> str:
    """The message in any of SGLang's error shapes, else the body's start."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for candidate in (error, data.get("message"), data.get("detail")):
            if isinstance(candidate, str) and candidate:
                return candidate
    text = body.decode("utf-8", "replace").strip()
    return text[:500] or f"HTTP {status}"


def _status_error(status: int, message: str) -> EngineError:
    """The engine error for an SGLang status code."""
    text = f"SGLang answered {status}: {message}"
    if status == HTTPStatus.SERVICE_UNAVAILABLE:
        return EngineUnavailable(text, engine_status=status)
    if 400 <= status < 500:
        return EngineRejected(text, engine_status=status)
    if status >= 500:
        return EngineServerError(text, engine_status=status)
    return EngineProtocolError(text, engine_status=status)


def _chunk(data: Any, rid: str) -> EngineChunk:
    """Read one `/generate` output; anything malformed is an `EngineProtocolError`."""
    if not isinstance(data, dict):
        raise EngineProtocolError(f"SGLang sent a non-object output for {rid!r}")
    text, output_ids, meta_info = data.get("text"), data.get("output_ids"), data.get("meta_info")
    if not isinstance(text, str) or not isinstance(meta_info, dict):
        raise EngineProtocolError(f"SGLang's output for {rid!r} lacks text or meta_info")
    if not isinstance(output_ids, list) or not all(isinstance(t, int) for t in output_ids):
        raise EngineProtocolError(f"SGLang's output for {rid!r} has malformed output_ids")
    chunk = EngineChunk(rid, text, output_ids, meta_info)
    reason = chunk.finish_reason
    if reason is not None and reason.get("type") == "abort":
        status = reason.get("status_code")
        message = str(reason.get("message") or "aborted")
        raise _status_error(status if isinstance(status, int) else 500, f"aborted: {message}")
    return chunk


def _chat_tokens(read_json: Callable[[], Any]) -> list[int]:
    """The `tokens` of a `/tokenize` answer to chat messages."""
    try:
        tokens = read_json().get("tokens")
    except (ValueError, AttributeError) as error:
        raise EngineProtocolError("SGLang /tokenize sent a malformed body") from error
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise EngineProtocolError("SGLang /tokenize sent no token list")
    return tokens


def _local_array(tokens: list[int]) -> TokenArray:
    """A local tokenizer's ids as a read-only int32 array (its vocabulary is far below 2**31)."""
    array = np.array(tokens, dtype=np.int32)
    array.flags.writeable = False
    return array


def _token_array(tokens: list[int]) -> TokenArray:
    """`tokens` as a read-only array: int32 while every id fits (vocabularies are far below
    2**31), else int64; the cache hands the same array to every caller."""
    try:
        wide = np.array(tokens, dtype=np.int64)
    except (OverflowError, ValueError, TypeError) as error:
        raise EngineProtocolError("SGLang /tokenize sent ids that are not token ids") from error
    array: TokenArray = wide
    if wide.size == 0 or (int(wide.min()) >= _INT32_MIN and int(wide.max()) <= _INT32_MAX):
        array = wide.astype(np.int32)
    array.flags.writeable = False
    return array


def _entry_bytes(text: str, tokens: TokenArray) -> int:
    return sys.getsizeof(text) + int(tokens.nbytes)


def _inline(text: str) -> bool:
    """Whether `text` is short enough to tokenize locally on the event loop."""
    return len(text) <= INLINE_TOKENIZE_CHARS


def _stream_error(error: Any) -> EngineError:
    """The engine error for a `data: {"error": ...}` event."""
    if isinstance(error, Mapping):
        message = str(error.get("message") or error)
        code = error.get("code")
        status = code if isinstance(code, int) and 400 <= code < 600 else HTTPStatus.BAD_REQUEST
    else:
        message, status = str(error), HTTPStatus.BAD_REQUEST
    return _status_error(status, message)


class SGLangHTTPEngine(EngineBase):
    """An SGLang server at `base_url` (see the module docstring)."""

    name = "sglang"

    def __init__(
        self,
        base_url: str,
        *,
        mode: DispatchMode = "priority",
        request_timeout: float | None = 600.0,
        connect_timeout: float = 5.0,
        control_timeout: float = 30.0,
        tokenize_cache_size: int = 65_536,
        tokenize_cache_bytes: int = 64 * 2**20,
        add_special_tokens: bool = True,
        api_key: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tokenizer: LocalTokenizer | None = None,
        vocab_size: int | None = None,
        learn_tokenizer: bool = False,
    ) -> None:
        super().__init__()
        if mode not in ("priority", "ordered"):
            raise ValueError(f"mode must be 'priority' or 'ordered', got {mode!r}")
        self.base_url = base_url.rstrip("/")
        self.mode: DispatchMode = mode
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.control_timeout = control_timeout
        self.add_special_tokens = add_special_tokens
        self._api_key = api_key
        self._ssl_context = ssl_context
        self._client: HTTPClient | None = None
        self._tokens: OrderedDict[str, TokenArray] = OrderedDict()
        self._context_length: int | None = None
        self._context_asked = False  # an SGLang without `max_model_len` is asked only once
        self._vocab_size = vocab_size
        self._vocab_asked = vocab_size is not None  # stated by the settings: never asked
        self._renders_chats = True  # its /tokenize takes chat `messages` (SGLang 0.5.23 does)
        self._tokenize_cache_size = tokenize_cache_size
        # Bounded in bytes too (the texts and their ids), and no entry above a 64th of that:
        # long prompts would otherwise fill it (a refused 1 MB prompt left 1.75 MB here).
        self._tokenize_cache_bytes = tokenize_cache_bytes
        self._token_bytes = 0
        self._text_of: dict[int, str] = {}  # id of a cached array -> its text (`forget_prompt`)
        # Texts being tokenized, by the first caller on its own task: later callers of the
        # same text wait for its future rather than asking again.
        self._tokenizing: dict[str, asyncio.Future[TokenArray]] = {}
        self.tokenizer = tokenizer
        # `--tokenizer auto`: the engine's own tokenizer files, when readable here, at start.
        self._learn_tokenizer = learn_tokenizer and tokenizer is None
        self._fallback_logged = False
        # The model's chat template rendered here, once it agreed with the engine's rendering;
        # `_chat_special`: whether its prompt is encoded with special tokens added.
        self._chat_template: ChatTemplate | None = None
        self._chat_special = False
        # Whether it also renders a chat with tools as the engine does (`TOOL_CHAT_PROBE`).
        self._tool_template = False
        # The local tokenizer serves only once it agreed with the engine's on the probes.
        self._tokenizer_agrees = tokenizer is None
        self._tokenizer_check: asyncio.Task[None] | None = None
        self._mismatch: TokenizerMismatch | None = None
        self.tokenize_hits = 0
        self.tokenize_misses = 0
        self._queue: asyncio.Queue[Generation] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None
        self._aborting: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Open the connection pool and start the sender."""
        if self._client is not None:
            return
        self._client = HTTPClient(
            self.base_url,
            connect_timeout=self.connect_timeout,
            authorization=f"Bearer {self._api_key}" if self._api_key else None,
            ssl_context=self._ssl_context,
        )
        self._sender = asyncio.create_task(self._send_in_order(), name="sglang-sender")
        if self._learn_tokenizer:
            await self._adopt_engine_tokenizer()
        elif self.tokenizer is not None:
            await self._check_tokenizer_at_start()

    async def _adopt_engine_tokenizer(self) -> None:
        """`--tokenizer auto`: the engine's own tokenizer and chat template, loaded from its
        `tokenizer_path` when this host can read it and used once they agree with the engine
        on the probes; otherwise the engine's `/tokenize`, and the reason logged once."""
        try:
            info = await self._control_json("/model_info", timeout=self.connect_timeout)
        except EngineError as error:
            self._use_engine_tokenizer(f"its /model_info did not answer ({error})")
            return
        path = info.get("tokenizer_path") if info else None
        location = Path(path).expanduser() if isinstance(path, str) and path else None
        if location is None or not location.exists():
            self._use_engine_tokenizer(f"its tokenizer_path {path!r} is not readable here")
            return
        folder = location if location.is_dir() else location.parent
        try:
            tokenizer = await asyncio.to_thread(HuggingFaceTokenizer, location)
            template = await asyncio.to_thread(load_chat_template, folder)
        except (TokenizerSetupError, ChatTemplateError) as error:
            self._use_engine_tokenizer(str(error))
            return
        self.tokenizer, self._tokenizer_agrees = tokenizer, False
        try:
            await self._check_tokenizer(timeout=self.connect_timeout)
        except TokenizerMismatch as mismatch:
            self.tokenizer, self._tokenizer_agrees, self._mismatch = None, True, None
            self._use_engine_tokenizer(str(mismatch))
            return
        except EngineError as error:  # compared again before the first prompt
            log.warning("the engine did not answer /tokenize at start (%s)", error)
            return
        log.info("tokenizing prompts here with the engine's tokenizer %s", tokenizer.description)
        if template is not None:
            await self._adopt_chat_template(template)

    async def _adopt_chat_template(self, template: ChatTemplate) -> None:
        """Render chats here once `template` gives the engine's ids on the probe chats."""
        assert self.tokenizer is not None
        encode = self.tokenizer.encode
        try:
            expected = [await self._engine_chat_ids(chat) for chat in CHAT_PROBES]
            rendered = [template.render(chat) for chat in CHAT_PROBES]
        except (EngineError, ChatTemplateError) as error:
            log.info("chats are rendered by the engine: the probe chats failed (%s)", error)
            return
        for special in (False, True):  # transformers adds none; a BOS-less template may
            local = [encode(text, add_special_tokens=special) for text in rendered]
            if local == [list(ids) for ids in expected]:
                self._chat_template, self._chat_special = template, special
                log.info("rendering chat templates here: they agree with the engine's")
                await self._check_tool_template(template, special)
                return
        log.warning(
            "the model's chat template rendered here gives other tokens than the engine's on "
            "the probe chats: chats are rendered by the engine (one round trip each)"
        )

    async def _check_tool_template(self, template: ChatTemplate, special: bool) -> None:
        """Render chats with tools here too once the probe with a tool agrees."""
        assert self.tokenizer is not None
        messages, tools = TOOL_CHAT_PROBE
        try:
            expected = await self._engine_tool_chat_ids(messages, tools)
            text = template.render_messages(messages, tools)
        except EngineError as error:
            log.info("chats with tools are rendered by the engine: %s", error)
            return
        if self.tokenizer.encode(text, add_special_tokens=special) == expected:
            self._tool_template = True
        else:
            log.warning(
                "the model's chat template rendered here gives other tokens than the engine's "
                "on a chat with tools: those are rendered by the engine (one round trip each)"
            )

    def _use_engine_tokenizer(self, reason: str) -> None:
        """Say once why prompts go to the engine's `/tokenize`."""
        if not self._fallback_logged:
            self._fallback_logged = True
            log.warning(
                "tokenizing prompts with the engine's /tokenize (a round trip per new prompt): %s",
                reason,
            )

    async def _check_tokenizer_at_start(self) -> None:
        """Compare the tokenizers now if the engine answers; a disagreement fails the start."""
        try:
            # A short deadline: an engine still starting must not hold up this server's start.
            await self._check_tokenizer(timeout=self.connect_timeout)
        except TokenizerMismatch:
            await self.close()
            raise
        except EngineError as error:
            log.warning(
                "the engine at %s did not answer /tokenize (%s): the local tokenizer is compared "
                "with it before the first prompt is tokenized",
                self.base_url,
                error,
            )

    async def close(self) -> None:
        """Cancel running generations and close the connection pool."""
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.wait([self._sender])
            self._sender = None
        await self._cancel_all()
        if self._tokenizer_check is not None and not self._tokenizer_check.done():
            self._tokenizer_check.cancel()
            await asyncio.wait([self._tokenizer_check])
        tokenizing, self._tokenizing = self._tokenizing, {}
        for waited in tokenizing.values():  # their first callers fail with the client below
            waited.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def health(self) -> bool:
        """True if SGLang's scheduler answers `/v1/loads` (200).

        Not SGLang's `/health`: that one queues a one-token generation at the lowest priority,
        which under load waits behind every auctioned request and shows in the waiting queue
        the saturation rule reads (`server.serving.pool`). `/v1/loads` is answered by the
        scheduler itself, so it proves the same liveness without generating. An SGLang without
        it is asked `/health`."""
        if self._client is None:
            return False
        for path in ("/v1/loads", "/health"):
            try:
                response = await self._client.request("GET", path, timeout=self.control_timeout)
            except HTTPClientError:
                return False
            if response.status != HTTPStatus.NOT_FOUND:
                return response.status == HTTPStatus.OK
        return False

    async def server_info(self) -> dict[str, Any] | None:
        """SGLang's `/server_info`: its flags, and the effective limits in `internal_states`.

        Its model name is remembered (`model_name`): the pool reads `/server_info` at start,
        whenever the engine answers again after failing to, and every half minute, so a
        restart with another model is seen."""
        info = await self._control_json("/server_info")
        if info is not None:
            self._learn_model_name(info)
        return info

    async def learn_model_name(self) -> str | None:
        """The served model's name, asked of `/model_info` now (None if it states none)."""
        info = await self._control_json("/model_info")
        if info is not None:
            self._learn_model_name(info)
        return self.model_name

    def _learn_model_name(self, info: Mapping[str, Any]) -> None:
        """SGLang answers OpenAI requests as `served_model_name`, which defaults to the model's
        path; `/model_info` states only the path."""
        for key in ("served_model_name", "model_path"):
            name = info.get(key)
            if isinstance(name, str) and name:
                if name != self.model_name:
                    log.info("the engine serves the model %r", name)
                    self.model_name = name
                return

    async def loads(self) -> dict[str, Any] | None:
        """SGLang's `/v1/loads`: each rank's waiting and running requests."""
        return await self._control_json("/v1/loads")

    async def _control_json(self, path: str, timeout: float | None = None) -> dict[str, Any] | None:
        """A GET of a control route as a JSON object (None if SGLang does not serve it)."""
        if self._client is None:
            raise EngineUnavailable("the SGLang engine is not started")
        try:
            response = await self._client.request(
                "GET", path, timeout=timeout or self.control_timeout
            )
        except HTTPTimeout as error:
            raise EngineTimeout(f"SGLang {path} timed out: {error!r}") from error
        except HTTPClientError as error:
            raise EngineUnavailable(f"SGLang {path} unreachable: {error!r}") from error
        if response.status == HTTPStatus.NOT_FOUND:
            return None
        if response.status != HTTPStatus.OK:
            raise _status_error(response.status, _error_message(response.content, response.status))
        try:
            data = response.json()
        except ValueError as error:
            raise EngineProtocolError(f"SGLang {path} sent a body that is not JSON") from error
        return data if isinstance(data, dict) else None

    async def tokenize(self, text: str) -> list[int]:
        """SGLang's token ids for `text`, from the cache or its `/tokenize`, as a new list."""
        tokens: list[int] = (await self.tokenize_array(text)).tolist()
        return tokens

    async def tokenize_array(self, text: str) -> TokenArray:
        """SGLang's token ids for `text`: the cached read-only array itself, never a copy."""
        cached = self._tokens.get(text)
        if cached is not None:
            self._tokens.move_to_end(text)
            self.tokenize_hits += 1
            return cached
        if self._tokenizer_agrees and self.tokenizer is not None and _inline(text):
            # The common case with a local tokenizer: no task, no await, nothing to share.
            self.tokenize_misses += 1
            return self._remember(text, self._encode_locally(text))
        waited = self._tokenizing.get(text)
        if waited is not None:
            self.tokenize_hits += 1
            return await self._tokenized_by_another(text, waited)
        self.tokenize_misses += 1
        # Tokenized on the caller's own task (no task per prompt); its future tells the
        # callers of the same text that arrive meanwhile.
        waited = self._tokenizing[text] = asyncio.get_running_loop().create_future()
        try:
            tokens = await self._tokens_of(text)
        except BaseException as error:
            if self._tokenizing.get(text) is waited:
                del self._tokenizing[text]
            if isinstance(error, asyncio.CancelledError):
                waited.cancel()  # its caller gave up: the others ask again themselves
            elif not waited.done():
                waited.set_exception(error)
                waited.exception()  # read here: nobody else may be waiting for it
            raise
        if self._tokenizing.get(text) is waited:
            del self._tokenizing[text]
        if not waited.done():
            waited.set_result(tokens)
        return tokens

    async def _tokenized_by_another(
        self, text: str, waited: asyncio.Future[TokenArray]
    ) -> TokenArray:
        """The ids another caller is fetching; asked again if that caller gave up first."""
        try:
            # Shielded: this caller giving up must not cancel the others' future.
            return await asyncio.shield(waited)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not waited.cancelled() or (current is not None and current.cancelling()):
                raise  # this caller itself was cancelled
        if self._client is None:
            raise EngineUnavailable("the SGLang engine is not started")
        return await self.tokenize_array(text)

    async def tokenize_chat(self, messages: list[tuple[str, str]]) -> TokenArray:
        """The conversation rendered by SGLang with the served model's chat template: its
        `/tokenize` with `messages`, which renders exactly as its own chat route does (with
        the assistant turn's opening). One round trip per conversation, not cached: every
        turn of a chat is a new prompt. An engine whose `/tokenize` refuses `messages` (one
        older than SGLang 0.5.23, or without a chat template) is sent the plain transcript
        (`server.engine.protocol.render_chat`) from then on."""
        if self._client is None:
            raise EngineUnavailable("the SGLang engine is not started")
        if self._chat_template is not None and self.tokenizer is not None:
            try:
                return await self._render_chat_locally(messages)
            except ChatTemplateError:
                pass  # the template refuses this chat: the engine says how, by its own rules
        if not self._renders_chats:
            return await self.tokenize_array(render_chat(messages))
        return _token_array(await self._engine_chat_ids(messages))

    async def tokenize_tool_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> TokenArray:
        """A chat with tools offered or tool calls in it, rendered with the served model's
        chat template: here once the template agreed on a chat with tools, else by the
        engine's `/tokenize`. `ChatRefused` when neither will render it (an engine that
        renders no chats cannot show the model its tools)."""
        if self._client is None:
            raise EngineUnavailable("the SGLang engine is not started")
        template, tokenizer, special = self._chat_template, self.tokenizer, self._chat_special
        if self._tool_template and template is not None and tokenizer is not None:
            try:
                text = template.render_messages(messages, tools)
            except ChatTemplateError as error:
                # It renders as the engine's does, so the engine would refuse it too.
                raise ChatRefused(str(error)) from None
            else:
                if len(text) <= INLINE_TOKENIZE_CHARS:
                    return _local_array(tokenizer.encode(text, add_special_tokens=special))
                ids = await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=special)
                return _local_array(ids)
        if not self._renders_chats:
            raise ChatRefused(
                "the engine's /tokenize does not render chat messages with the model's chat "
                "template, so it cannot show the model tools or tool calls"
            )
        return _token_array(await self._engine_tool_chat_ids(messages, tools))

    async def _engine_tool_chat_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """The engine's ids of a chat with tools; its 4xx is the client's `ChatRefused`."""
        assert self._client is not None
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body.update(tools=tools, tool_choice="auto")  # the tools the template is to see
        try:
            response = await self._client.request(
                "POST", "/tokenize", body, timeout=self.control_timeout
            )
        except HTTPTimeout as error:
            raise EngineTimeout(f"SGLang /tokenize timed out: {error!r}") from error
        except HTTPClientError as error:
            raise EngineUnavailable(f"SGLang /tokenize unreachable: {error!r}") from error
        status = response.status
        if HTTPStatus.BAD_REQUEST <= status < HTTPStatus.INTERNAL_SERVER_ERROR:
            message = _error_message(response.content, status)
            raise ChatRefused(f"the engine would not render the chat: {message}")
        if status != HTTPStatus.OK:
            raise _status_error(status, _error_message(response.content, status))
        return _chat_tokens(response.json)

    async def _render_chat_locally(self, messages: list[tuple[str, str]]) -> TokenArray:
        """The chat's ids from the model's template and tokenizer, here."""
        template, tokenizer, special = self._chat_template, self.tokenizer, self._chat_special
        assert template is not None and tokenizer is not None

        def ids() -> TokenArray:
            text = template.render(messages)
            return _local_array(tokenizer.encode(text, add_special_tokens=special))

        if sum(len(content) for _, content in messages) <= INLINE_TOKENIZE_CHARS:
            return ids()
        return await asyncio.to_thread(ids)

    async def _engine_chat_ids(self, messages: list[tuple[str, str]]) -> list[int]:
        """The engine's ids of a chat (its `/tokenize` with `messages`); an engine that refuses
        chats is sent the plain transcript from then on."""
        assert self._client is not None
        if not self._renders_chats:
            return await self.tokenize(render_chat(messages))
        body = {"messages": [{"role": role, "content": content} for role, content in messages]}
        try:
            response = await self._client.request(
                "POST", "/tokenize", body, timeout=self.control_timeout
            )
        except HTTPTimeout as error:
            raise EngineTimeout(f"SGLang /tokenize timed out: {error!r}") from error
        except HTTPClientError as error:
            raise EngineUnavailable(f"SGLang /tokenize unreachable: {error!r}") from error
        if HTTPStatus.BAD_REQUEST <= response.status < HTTPStatus.INTERNAL_SERVER_ERROR:
            log.warning(
                "SGLang's /tokenize refused chat messages (%s): chats are sent as plain "
                "transcripts",
                _error_message(response.content, response.status),
            )
            self._renders_chats = False
            return await self.tokenize(render_chat(messages))
        if response.status != HTTPStatus.OK:
            status = response.status
            raise _status_error(status, _error_message(response.content, status))
        return _chat_tokens(response.json)

    async def context_length(self) -> int | None:
        """SGLang's context length (`max_model_len` of its `/tokenize`), asked once."""
        if self._context_length is None and not self._context_asked:
            await self._fetch_tokens("a")
            self._context_asked = True
        return self._context_length

    async def vocab_size(self) -> int | None:
        """The model's vocabulary size (`server.engine.vocabulary`), learnt once."""
        if not self._vocab_asked:
            info = await self._control_json("/model_info")
            self._vocab_size = await asyncio.to_thread(learn_vocab_size, info, self.tokenizer)
            self._vocab_asked = True
        return self._vocab_size

    async def _tokens_of(self, text: str) -> TokenArray:
        """The ids of a text not in the cache, from the local tokenizer or SGLang's."""
        if self.tokenizer is None:
            return await self._fetch_tokens(text)
        await self._check_tokenizer(timeout=self.control_timeout)
        if _inline(text):
            return self._remember(text, self._encode_locally(text))
        return self._remember(text, await asyncio.to_thread(self._encode_locally, text))

    def _encode_locally(self, text: str) -> TokenArray:
        """The local tokenizer's ids (runs in a worker thread for a long text)."""
        assert self.tokenizer is not None
        return _local_array(self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens))

    async def _check_tokenizer(self, *, timeout: float) -> None:
        """Return once the local tokenizer agreed with SGLang's; one comparison at a time."""
        if self._mismatch is not None:
            raise self._mismatch
        if self._tokenizer_agrees:
            return
        check = self._tokenizer_check
        if check is None or check.done():  # the first, or the last one could not reach SGLang
            check = asyncio.create_task(self._compare_tokenizers(timeout))
            self._tokenizer_check = check
        await asyncio.shield(check)

    async def _compare_tokenizers(self, timeout: float) -> None:
        assert self.tokenizer is not None
        # One probe after another: an engine that fails the first is asked nothing more.
        answers = [await self._ask(text, timeout) for text in PROBE_TEXTS]
        tokenizer, special = self.tokenizer, self.add_special_tokens
        problem = tokenizer_disagreement(
            lambda text: tokenizer.encode(text, add_special_tokens=special),
            dict(zip(PROBE_TEXTS, answers, strict=True)),
        )
        if problem is not None:
            self._mismatch = TokenizerMismatch(
                f"the local tokenizer ({tokenizer.description}) disagrees with the engine at "
                f"{self.base_url}: {problem}. Set --tokenizer (INFERENCE_AUCTION_TOKENIZER) to "
                "the tokenizer.json of the model that engine serves, or to 'engine' to let the "
                "engine tokenize every prompt"
            )
            log.error("%s", self._mismatch.message)
            raise self._mismatch
        self._tokenizer_agrees = True
        log.info("the local tokenizer (%s) agrees with the engine's", tokenizer.description)

    def _remember(self, text: str, tokens: TokenArray) -> TokenArray:
        """Cache `tokens` as the ids of `text`, dropping the least recently used beyond the
        size or the bytes; an entry above a 64th of the bytes is not kept at all."""
        size = _entry_bytes(text, tokens)
        if size > self._tokenize_cache_bytes // 64 or text in self._tokens:
            return tokens
        self._tokens[text] = tokens
        self._text_of[id(tokens)] = text
        self._token_bytes += size
        while self._tokens and (
            len(self._tokens) > self._tokenize_cache_size
            or self._token_bytes > self._tokenize_cache_bytes
        ):
            self._drop(next(iter(self._tokens)))
        return tokens

    def forget_prompt(self, tokens: Any) -> None:
        """Drop a refused request's prompt from the cache: refused requests do not feed it."""
        text = self._text_of.get(id(tokens))
        if text is not None and self._tokens.get(text) is tokens:
            self._drop(text)

    def _drop(self, text: str) -> None:
        tokens = self._tokens.pop(text)
        self._text_of.pop(id(tokens), None)
        self._token_bytes -= _entry_bytes(text, tokens)

    @property
    def tokenize_cache_bytes(self) -> int:
        """What the cached prompts and their ids take, as counted against the bound."""
        return self._token_bytes

    async def flush_cache(self) -> bool:
        """Ask SGLang's `/flush_cache`: 200 when it flushed, 400 while requests run or wait."""
        if self._client is None:
            raise EngineUnavailable("the SGLang client is closed")
        try:
            response = await self._client.request(
                "POST", "/flush_cache", timeout=self.control_timeout
            )
        except HTTPTimeout as error:
            raise EngineTimeout(f"SGLang's /flush_cache timed out: {error}") from None
        except HTTPClientError as error:
            raise EngineUnavailable(f"SGLang unreachable at {self.base_url}: {error}") from None
        return response.status == HTTPStatus.OK

    def _send(self, generations: list[Generation]) -> None:
        for generation in generations:
            if self._client is None:
                generation.fail(EngineUnavailable("the SGLang engine is not started"))
            else:
                self._queue.put_nowait(generation)

    async def _send_in_order(self) -> None:
        """Start each generation once the one before it is admitted (see the docstring)."""
        while True:
            generation = await self._queue.get()
            client = self._client
            if generation.done() or client is None:
                continue
            generation.start(self._generate(generation, client, self._written(generation, client)))
            await generation.admitted()  # no wait at all when it was written just now

    def _written(self, generation: Generation, client: HTTPClient) -> StreamRequest | None:
        """A streamed request's stream, written at once when an idle connection is at hand;
        None for a request that is not streamed, or one whose body cannot be encoded (its
        task then reports the error)."""
        if not self._streams(generation.request):
            return None
        try:
            streaming = self._stream_request(generation, client)
        except (TypeError, ValueError):
            return None
        if streaming.send_now():
            # Closed if the reading task never gets to it (the generation ended first).
            generation.on_end(streaming.abandon)
        return streaming

    async def _fetch_tokens(self, text: str) -> TokenArray:
        """SGLang's ids for `text`, cached."""
        return self._remember(text, _token_array(await self._ask(text, self.control_timeout)))

    async def _ask(self, text: str, timeout: float) -> list[int]:
        """SGLang's `/tokenize` answer for `text` (it also tells the context length)."""
        if self._client is None:
            raise EngineUnavailable("the SGLang engine is not started")
        body = {"prompt": text, "add_special_tokens": self.add_special_tokens}
        try:
            response = await self._client.request("POST", "/tokenize", body, timeout=timeout)
        except HTTPTimeout as error:
            raise EngineTimeout(f"SGLang /tokenize timed out: {error!r}") from error
        except HTTPClientError as error:
            raise EngineUnavailable(f"SGLang /tokenize unreachable: {error!r}") from error
        if response.status != HTTPStatus.OK:
            status = response.status
            raise _status_error(status, _error_message(response.content, status))
        try:
            data = response.json()
            tokens = data.get("tokens")
        except (ValueError, AttributeError) as error:
            raise EngineProtocolError("SGLang /tokenize sent a malformed body") from error
        limit = data.get("max_model_len")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            self._context_length = limit
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EngineProtocolError("SGLang /tokenize sent no token list")
        return tokens

    def _streams(self, request: EngineRequest) -> bool:
        """Whether the request is streamed from SGLang (always, in `ordered` mode)."""
        return request.stream or self.mode == "ordered"

    def _body(self, generation: Generation) -> dict[str, Any]:
        request = generation.request
        params = request.sampling_params
        body: dict[str, Any] = {
            "input_ids": request.input_ids,
            "sampling_params": params,
            "rid": request.rid,
            "stream": self._streams(request),
        }
        if "return_logprob" in params:  # request options carried with the sampling ones
            params = dict(params)
            body.update((key, params.pop(key)) for key in REQUEST_LEVEL_KEYS if key in params)
            body["sampling_params"] = params
        if self.mode == "priority":
            body["priority"] = request.priority
        return body

    def _on_sent(self, generation: Generation) -> Callable[[], None] | None:
        # In `priority` mode the next request may follow once this one is on the wire.
        return generation.admit if self.mode == "priority" else None

    def _stream_request(self, generation: Generation, client: HTTPClient) -> StreamRequest:
        """The generation's streamed `/generate`, not written yet."""
        return client.stream(
            "POST",
            "/generate",
            self._body(generation),
            timeout=self.request_timeout,
            on_sent=self._on_sent(generation),
            headers=generation.request.headers,
        )

    async def _generate(
        self, generation: Generation, client: HTTPClient, streaming: StreamRequest | None
    ) -> None:
        request = generation.request
        try:
            if self._streams(request):
                if streaming is None:
                    streaming = self._stream_request(generation, client)
                await self._generate_streamed(generation, streaming)
            else:
                body = self._body(generation)
                await self._generate_once(generation, client, body, self._on_sent(generation))
        except DeadlineExceeded as error:
            # Queueing at SGLang can take minutes, so there is no read timeout: one deadline
            # covers the whole request.
            raise EngineTimeout(
                f"SGLang did not finish {request.rid!r} within {self.request_timeout} s"
            ) from error
        except HTTPTimeout as error:
            raise EngineTimeout(f"SGLang timed out on {request.rid!r}: {error!r}") from error
        except HTTPClientError as error:
            raise EngineUnavailable(f"SGLang unreachable for {request.rid!r}: {error!r}") from error
        except asyncio.CancelledError:
            # Cancelled (its client left, a deadline passed): the dropped connection aborts it
            # too, but SGLang notices that only at its next check; `/abort_request` at once.
            self._abort_at_engine(request.rid)
            raise

    def _abort_at_engine(self, rid: str) -> None:
        if self._client is None or self._closed:
            return
        task = asyncio.create_task(self._post_abort(self._client, rid))
        self._aborting.add(task)
        task.add_done_callback(self._aborting.discard)

    async def _post_abort(self, client: HTTPClient, rid: str) -> None:
        try:
            await client.request(
                "POST", "/abort_request", {"rid": rid}, timeout=self.control_timeout
            )
        except HTTPClientError as error:  # the dropped connection still aborts it
            log.info("SGLang's /abort_request for %r failed: %r", rid, error)

    async def _generate_once(
        self,
        generation: Generation,
        client: HTTPClient,
        body: dict[str, Any],
        on_sent: Callable[[], None] | None,
    ) -> None:
        response = await client.request(
            "POST",
            "/generate",
            body,
            timeout=self.request_timeout,
            on_sent=on_sent,
            headers=generation.request.headers,
        )
        status = response.status
        if status != HTTPStatus.OK:
            raise _status_error(status, _error_message(response.content, status))
        try:
            data = response.json()
        except ValueError as error:
            raise EngineProtocolError("SGLang sent a body that is not JSON") from error
        chunk = _chunk(data, generation.rid)
        if not chunk.finished:
            raise EngineProtocolError(f"SGLang's answer for {generation.rid!r} is not finished")
        generation.finish(EngineResult.from_chunk(chunk))

    async def _generate_streamed(self, generation: Generation, streaming: StreamRequest) -> None:
        loop = asyncio.get_running_loop()
        first_chunk: float | None = None
        last: EngineChunk | None = None
        async with streaming as response:
            # From the moment the request was written (by the sender, or on entering).
            sent = loop.time() if streaming.sent_at is None else streaming.sent_at
            status = response.status
            if status != HTTPStatus.OK:
                raise _status_error(status, _error_message(await response.read(), status))
            done = False
            try:
                async for payload in response.events():
                    # After `[DONE]` the body is read to its end, so that the connection can
                    # be reused, and anything more is ignored.
                    if done or payload == b"[DONE]":
                        done = True
                        continue
                    try:
                        data = orjson.loads(payload)
                    except orjson.JSONDecodeError as error:
                        raise EngineProtocolError(
                            "SGLang streamed an event that is not JSON"
                        ) from error
                    if isinstance(data, dict) and "error" in data:
                        raise _stream_error(data["error"])
                    last = _chunk(data, generation.rid)
                    if first_chunk is None:
                        first_chunk = loop.time() - sent
                    generation.emit(last)
            except HTTPTimeout:
                raise  # the deadline, not a broken stream
            except HTTPClientError as error:
                raise EngineProtocolError(
                    f"SGLang's stream for {generation.rid!r} broke: {error!r}"
                ) from error
        if last is None or not last.finished:
            raise EngineProtocolError(
                f"SGLang's stream for {generation.rid!r} ended before the request finished"
            )
        generation.finish(EngineResult.from_chunk(last, client_ttft=first_chunk))
