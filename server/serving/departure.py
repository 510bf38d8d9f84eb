"""A client that leaves after its batch closed: its generation stops at once.

Every HTTP handler following a ticket calls `client_left` when its client goes; once none is
left, the ticket is marked and its generation cancelled, which aborts it at the engine (the
emulator aborts a request whose stream is dropped, the SGLang backend also posts
`/abort_request`), freeing its slot. A ticket not sent yet is stopped as soon as it is
(`sent`). What the departed request costs is decided when its follower sees it end
(`server.serving.following`), by the rule of docs/SPEC.md, "A client that leaves": after its first
token it keeps its charge and is recorded `abandoned`; before it, it is `failed` and refunded
by the per-request rule.
"""

from __future__ import annotations

from collections.abc import Callable

from inference_auctions.server.serving.tickets import Ticket

__all__ = ["client_left", "sent"]

_REASON = "the client disconnected"


def client_left(ticket: Ticket) -> None:
    """A client following `ticket` left; stop its work if no other one follows it."""
    if ticket.done or ticket.left or ticket.waiters > 0:
        return
    ticket.left = True
    if ticket.stop is not None:
        ticket.stop(_REASON)


def sent(ticket: Ticket, stop: Callable[[str], None]) -> None:
    """The ticket's generation was sent; `stop` ends it (at once if its client already left)."""
    ticket.stop = stop
    if ticket.left:
        stop(_REASON)
