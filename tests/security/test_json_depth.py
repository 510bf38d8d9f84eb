"""The nesting depth measured on raw bytes: the same for a few brackets (a Python loop) as for
many (numpy), and the same as a plain count, for any bytes, balanced or not."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.server.api.schemas import json_depth


def _reference(body: bytes) -> int:
    """The deepest nesting outside strings, counted one byte at a time."""
    depth, deepest, in_string, escaped = 0, None, False, False
    for byte in body:
        char = chr(byte)
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = depth if deepest is None else max(deepest, depth)
        elif char in "]}":
            depth -= 1
            deepest = depth if deepest is None else max(deepest, depth)
    return deepest or 0


@given(st.lists(st.sampled_from(["[", "]", "{", "}", '"[{"', "1", ","]), max_size=200))
def test_depth_of_any_brackets_matches_a_plain_count(parts: list[str]) -> None:
    body = "".join(parts).encode()
    assert json_depth(body) == _reference(body)


def test_depth_of_json_bodies_small_and_large() -> None:
    for levels in (0, 1, 2, 31, 32, 33, 200):
        nested: object = "x"
        for _ in range(levels):
            nested = {"a": [nested]}
        body = json.dumps({"text": "[[{", "deep": nested}).encode()
        assert json_depth(body) == 1 + 2 * levels == _reference(body)
