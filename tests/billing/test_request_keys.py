"""A request's ledger key is built and read by one pair of functions of billing's door."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.billing import client_rid, request_key

# User names as the ledger accepts them (never a '/'); rids are anything a client sends.
users = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,20}", fullmatch=True)


@given(users, st.text(min_size=1, max_size=40))
def test_the_client_rid_comes_back_out_of_its_key_whatever_it_holds(user: str, rid: str) -> None:
    key = request_key(user, rid)
    assert client_rid(key) == rid
    assert key.startswith(user)


@given(users, users, st.text(min_size=1, max_size=10))
def test_two_users_keys_of_one_rid_differ(first: str, second: str, rid: str) -> None:
    assert (request_key(first, rid) == request_key(second, rid)) == (first == second)


def test_a_key_without_a_user_is_read_as_it_is() -> None:
    assert client_rid("lone") == "lone"
