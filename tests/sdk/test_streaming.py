"""Streaming: the auction first, then text; errors mid-stream; early ends."""

from __future__ import annotations

import json

import httpx
import pytest

from inference_auctions import sdk
from inference_auctions.sdk import AsyncAuctionClient, AuctionClient, Budget
from inference_auctions.sdk._streaming import SSEDecoder

from .conftest import BASE_URL, async_transport, transport
from .fake_server import API_KEY, FakeServer, error_response

pytestmark = pytest.mark.usefixtures("fast_retries")


def make_client(server: FakeServer) -> AuctionClient:
    budget = Budget(total="50", auctions=1000)
    return AuctionClient(
        BASE_URL, API_KEY, budget=budget, transport=transport(server), sync_on_start=False
    )


def test_sse_decoder_joins_data_lines_and_skips_comments() -> None:
    decoder = SSEDecoder()
    lines = [": keep-alive", "event: message", 'data: {"a":', "data: 1}", "", "", "data:x"]
    assert [decoder.feed(line) for line in lines] == [
        None,
        None,
        None,
        None,
        '{"a":\n1}',
        None,
        None,
    ]
    assert decoder.flush() == "x"
    assert decoder.flush() is None


def test_generate_stream_yields_the_auction_first_then_text(server: FakeServer) -> None:
    server.queue("/generate", error_response(503, "unavailable"))
    with make_client(server) as client:
        with client.generate("hello world", value="0.2", stream=True) as stream:
            first = next(stream)
            assert isinstance(first, sdk.Auction)
            # The charge is settled as soon as the batch clears.
            assert client.bidder.spent_micros == first.charge_micros == 200_000
            assert client.bidder.in_flight_micros == 0
            chunks = list(stream)
            final = stream.get_final()
        assert all(isinstance(c, str) for c in chunks)
        assert "".join(str(c) for c in chunks) == "echo: hello world"
        assert len(chunks) == 2  # cumulative events became deltas
        assert final.text == stream.text == "echo: hello world"
        assert final.auction == first
        assert final.usage.completion_tokens == 3
        assert final.rid == stream.rid
    request = server.attempts[-1]
    assert request.headers["accept"] == "text/event-stream"
    assert json.loads(request.content)["stream"] is True
    assert len(set(server.rids())) == 1


def test_an_error_mid_stream_raises_and_is_refunded() -> None:
    server = FakeServer(stream_error=True)
    with make_client(server) as client:
        stream = client.generate("hello", value="0.2", stream=True)
        assert isinstance(next(stream), sdk.Auction)
        assert client.bidder.spent_micros == 200_000
        with pytest.raises(sdk.StreamError) as info:
            next(stream)
        assert info.value.type == "engine_error"
        assert client.bidder.spent_micros == 0
        assert stream.response.is_closed
        # The final result of a failed stream is the error again, never a partial result.
        with pytest.raises(sdk.StreamError) as again:
            stream.get_final()
        assert again.value is info.value


def test_get_final_of_a_failed_stream_raises_without_iterating_first() -> None:
    server = FakeServer(stream_error=True)
    with make_client(server) as client:
        stream = client.generate("hello", value="0.2", stream=True)
        with pytest.raises(sdk.StreamError):
            stream.get_final()
        with pytest.raises(sdk.StreamError):
            stream.get_final()


def test_a_stream_cut_short_raises_a_connection_error(server: FakeServer) -> None:
    auction = {
        "batch_id": "b",
        "position": 0,
        "batch_size": 1,
        "priority": 1.0,
        "bid_micros": 200_000,
        "charge_micros": 150_000,
    }
    event = {"text": "", "output_ids": [], "meta_info": {"id": "r", "auction": auction}}
    body = f"data: {json.dumps(event)}\n\ndata: {json.dumps({**event, 'text': 'par'})}"
    server.queue("/generate", httpx.Response(200, content=body.encode()))
    with make_client(server) as client:
        with (
            pytest.raises(sdk.APIConnectionError),
            client.generate("hello", value="0.2", stream=True) as stream,
        ):
            assert list(stream) == []  # never reached
        assert stream.text == "par"
        assert client.bidder.spent_micros == 150_000  # the batch cleared: its charge stands


def test_closing_before_the_auction_counts_the_bid(server: FakeServer) -> None:
    with make_client(server) as client:
        with client.generate("hello", value="0.2", stream=True):
            pass
        assert client.bidder.spent_micros == 200_000
        assert client.bidder.in_flight_micros == 0


def test_chat_stream(server: FakeServer) -> None:
    with make_client(server) as client:
        messages = [{"role": "user", "content": "Hi"}]
        with client.chat(messages, value="0.1", stream=True) as stream:
            items = list(stream)
            final = stream.get_final()
        assert isinstance(items[0], sdk.Auction)
        assert items[1:] == ["Hello", " there"]
        assert final.text == "Hello there"
        assert final.choices[0].finish_reason == "stop"
        assert final.usage is not None and final.usage.total_tokens == 6
        assert client.bidder.spent_micros == 100_000


@pytest.mark.anyio
async def test_async_streams(server: FakeServer) -> None:
    async with AsyncAuctionClient(
        BASE_URL,
        API_KEY,
        budget=Budget(total="50", auctions=1000),
        transport=async_transport(server),
        sync_on_start=False,
    ) as client:
        async with await client.generate("hi", value="0.2", stream=True) as stream:
            items = [item async for item in stream]
        assert isinstance(items[0], sdk.Auction)
        assert "".join(str(i) for i in items[1:]) == "echo: hi"
        assert (await stream.get_final()).text == "echo: hi"
        chat = await client.chat([{"role": "user", "content": "Hi"}], value="0.1", stream=True)
        assert (await chat.get_final()).text == "Hello there"
        await chat.close()
        assert client.bidder.spent_micros == server.total_charged
        assert client.bidder.in_flight_micros == 0
