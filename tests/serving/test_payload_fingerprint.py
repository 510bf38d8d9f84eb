"""A payload's fingerprint is stored with its hold: a retry after a restart (or on another
replica) is told from a conflicting reuse of its rid by it, so it must never change."""

from __future__ import annotations

from decimal import Decimal

from inference_auctions.server.serving.admission import payload_fingerprint


def test_fingerprints_stay_what_holds_already_store() -> None:
    plain = {
        "text": "Hi",
        "input_ids": None,
        "sampling": {"max_new_tokens": 4, "temperature": 0.7},
        "bid": 250000,
    }
    assert payload_fingerprint(plain) == (
        "f544d0bd8f0c1b1a89c7b7659417f963645cde341773ca5afc205475aebbb984"
    )
    unusual = {
        "text": None,
        "input_ids": [1, 2, 3],
        "sampling": {"stop": ["é", "\n"], "custom_params": {"z": 1.5, "a": [Decimal("0.1")]}},
        "bid": 0,
    }
    assert payload_fingerprint(unusual) == (
        "d90ba203326fbe10352ca8ebcdb972d47a90d8d048282158f5547b289beccb3f"
    )


def test_key_order_does_not_matter_but_every_value_does() -> None:
    payload = {"text": "a", "bid": 1, "sampling": {"top_p": 0.5, "max_new_tokens": 3}}
    reordered = {"sampling": {"max_new_tokens": 3, "top_p": 0.5}, "bid": 1, "text": "a"}
    assert payload_fingerprint(payload) == payload_fingerprint(reordered)
    assert payload_fingerprint(payload) != payload_fingerprint({**payload, "bid": 2})
