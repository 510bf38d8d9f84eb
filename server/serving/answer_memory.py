"""The server-wide memory budget for answers: in flight, and kept for retries.

An admitted request reserves the most its answer can hold in this process (`max_new_tokens`
times `RESERVED_BYTES_PER_TOKEN`: its cumulative text, its ids as Python ints, and the copy
being rendered for its client) until it ends. A finished answer is kept for retries of its rid
and counted at its real size (`KEPT_BYTES_PER_TOKEN` per token) until it is dropped; kept
answers are dropped, oldest first, to make room for a new request, and only when what is in
flight fills the budget is a request refused: 503 with Retry-After, before any money moves.
A flood of long answers, free or not, thus makes the server refuse work, never run out of
memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from inference_auctions.server.engine.contract import DEFAULT_MAX_NEW_TOKENS
from inference_auctions.server.serving.admission import unavailable
from inference_auctions.server.serving.tickets import Ticket

__all__ = ["KEPT_BYTES_PER_TOKEN", "RESERVED_BYTES_PER_TOKEN", "AnswerMemory"]

# Measured in tests/security/test_answer_memory.py: an answer of n tokens held by the server
# costs about 60 bytes a token while it streams; reserved with room to spare.
RESERVED_BYTES_PER_TOKEN = 128
KEPT_BYTES_PER_TOKEN = 64
PROMPT_BYTES_PER_TOKEN = 8  # the prompt's ids (int32) and its place in the tokenizer cache


class AnswerMemory:
    """Reservations of answers in flight and the answers kept, within `limit_bytes`;
    `forget(ticket)` drops a kept answer's ticket from the retry table."""

    def __init__(self, limit_bytes: int, forget: Callable[[Ticket], None]) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self._forget = forget
        self._kept: deque[tuple[Ticket, int]] = deque()

    def reserve(self, ticket: Ticket, max_new_tokens_limit: int) -> None:
        """Reserve the ticket's answer, released when it finishes; 503 if it cannot fit."""
        need = self._reservation(ticket, max_new_tokens_limit)
        while self.used_bytes + need > self.limit_bytes and self._kept:
            kept, size = self._kept.popleft()
            self.used_bytes -= size
            self._forget(kept)
        if self.used_bytes + need > self.limit_bytes:
            mib = self.limit_bytes / 2**20
            raise unavailable(
                f"answers in flight fill the server's memory budget for answers ({mib:,.0f} "
                "MiB, answer_memory_mib); retry shortly, or ask for fewer max_new_tokens"
            )
        self.used_bytes += need
        ticket.on_finish.append(lambda: self._finished(ticket, need))

    def _finished(self, ticket: Ticket, reserved: int) -> None:
        self.used_bytes -= reserved
        chunk = ticket.last_chunk
        if chunk is None or ticket.error is not None:
            return
        size = len(chunk.output_ids) * KEPT_BYTES_PER_TOKEN + len(chunk.text)
        self.used_bytes += size
        self._kept.append((ticket, size))

    @staticmethod
    def _reservation(ticket: Ticket, max_new_tokens_limit: int) -> int:
        asked: Any = ticket.sampling_params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        tokens = asked if isinstance(asked, int) and asked >= 0 else max_new_tokens_limit
        return tokens * RESERVED_BYTES_PER_TOKEN + len(ticket.tokens) * PROMPT_BYTES_PER_TOKEN
