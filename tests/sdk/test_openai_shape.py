"""The SDK where an OpenAI user looks, against a real server: `chat.completions.create`, typed
chunks and `.text_stream`, `service_tier=`, and the `code` of error bodies."""

from __future__ import annotations

import pytest

from inference_auctions import sdk
from inference_auctions.sdk import AsyncAuctionClient, AuctionClient, Budget

from .live_server import LiveServer

PLAN = Budget(total="100", auctions=1000)
HI = [{"role": "user", "content": "Hi there"}]


def test_chat_completions_create_is_chat_in_openais_shape(live: LiveServer) -> None:
    _, key = live.new_user()
    with AuctionClient(live.url, key, budget=PLAN) as client:
        plain = client.chat.completions.create(messages=HI, max_tokens=6)
        valued = client.chat.completions.create(messages=HI, value="0.5", max_tokens=6)
        old = client.chat(HI, value="0.5", max_tokens=6)
    assert isinstance(plain, sdk.ChatCompletion) and plain.choices[0].message.content
    assert plain.auction is not None and plain.auction.bid_micros == 0  # no value: bid 0
    assert valued.auction is not None and valued.auction.bid_micros > 0
    assert old.auction is not None and old.auction.bid_micros == valued.auction.bid_micros


def test_streamed_chunks_are_typed_and_add_up_to_the_answer(live: LiveServer) -> None:
    _, key = live.new_user()
    with (
        AuctionClient(live.url, key, budget=PLAN) as client,
        client.chat.completions.create(
            messages=HI, value="0.1", max_tokens=12, stream=True
        ) as stream,
    ):
        chunks = list(stream)
        final = stream.get_final()
    assert chunks and all(isinstance(c, sdk.ChatCompletionChunk) for c in chunks)
    assert all(c.object == "chat.completion.chunk" and c.id == final.id for c in chunks)
    # The first chunk comes when the batch clears, with the auction.
    assert chunks[0].auction is not None and chunks[0].auction == final.auction
    assert all(c.auction in (None, final.auction) for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == final.text
    assert final.text and final.choices[0].finish_reason in ("stop", "length")
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_text_stream_yields_only_the_text(live: LiveServer) -> None:
    _, key = live.new_user()
    with AuctionClient(live.url, key, budget=PLAN) as client:
        with client.generate("Tell me", value="0.1", max_new_tokens=10, stream=True) as stream:
            pieces = list(stream.text_stream)
            generation = stream.get_final()
        with client.chat.completions.create(messages=HI, max_tokens=10, stream=True) as chunks:
            chat_pieces = list(chunks.text_stream)
            chat = chunks.get_final()
    assert pieces and all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == generation.text and stream.auction == generation.auction
    assert "".join(chat_pieces) == chat.text and chunks.auction is not None


@pytest.mark.anyio
async def test_the_async_client_has_the_same(live: LiveServer) -> None:
    _, key = live.new_user()
    async with AsyncAuctionClient(live.url, key, budget=PLAN) as client:
        whole = await client.chat.completions.create(messages=HI, value="0.1", max_tokens=6)
        stream = await client.chat.completions.create(
            messages=HI, value="0.1", max_tokens=10, stream=True
        )
        async with stream:
            chunks = [chunk async for chunk in stream]
            final = await stream.get_final()
        texts = await client.chat(HI, value="0.1", max_tokens=10, stream=True)
        async with texts:
            pieces = [piece async for piece in texts.text_stream]
    assert isinstance(whole, sdk.ChatCompletion) and whole.auction is not None
    assert all(isinstance(c, sdk.ChatCompletionChunk) for c in chunks)
    assert "".join(c.text for c in chunks) == final.text
    assert "".join(pieces) == texts.text and pieces


def test_service_tier_is_sent_and_refused_by_name_on_an_auction_server(
    live: LiveServer,
) -> None:
    _, key = live.new_user()
    with AuctionClient(live.url, key, budget=PLAN, max_retries=0) as client:
        auto = client.generate("hi", value="0.01", max_new_tokens=2, service_tier="auto")
        assert auto.auction is not None
        with pytest.raises(sdk.BadRequestError) as refused:
            client.chat.completions.create(messages=HI, max_tokens=2, service_tier="premium")
        with pytest.raises(sdk.BadRequestError) as raw:
            client.with_raw_response.chat(HI, value="0", max_tokens=2, service_tier="premium")
    assert refused.value.param == "service_tier" and refused.value.code == "invalid_value"
    assert "leave service_tier out" in str(refused.value)
    assert raw.value.param == "service_tier"


def test_error_bodies_carry_openais_code(live: LiveServer) -> None:
    wrong = AuctionClient(live.url, "iak_wrong", budget=PLAN, sync_on_start=False)
    with wrong, pytest.raises(sdk.AuthenticationError) as info:
        wrong.chat.completions.create(messages=HI, max_tokens=2)
    assert info.value.code == "invalid_api_key" and info.value.type == "unauthenticated"
    _, key = live.new_user(budget_micros=1_000)
    poor = AuctionClient(live.url, key, budget=Budget(total="100", auctions=10), max_retries=0)
    with poor, pytest.raises(sdk.InsufficientFundsError) as short:
        poor.generate("hi", value="50", max_new_tokens=2)
    assert short.value.code == "insufficient_quota" and short.value.param == "bid"
