"""The README's OpenAI example runs as written (its URL aside) against a real server, and its
bid reaches the auction."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.db_fixtures import migrated_database
from tests.server.harness import running_server

README = Path(__file__).parents[2] / "README.md"


def _openai_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.DOTALL | re.MULTILINE)
    (example,) = [block for block in blocks if "from openai import OpenAI" in block]
    return example


def test_the_readmes_openai_example_bids_through_extra_body(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = _openai_example()
    assert 'extra_body={"bid": "0.05"}' in example
    with migrated_database("sqlite", tmp_path) as db, running_server(db) as server:
        key = server.create_user("alice")
        code = example.replace("http://127.0.0.1:8000", server.url)
        namespace: dict[str, Any] = {"KEY": key}
        exec(compile(code, "README.md (OpenAI example)", "exec"), namespace)
        namespace["openai_client"].close()
        (entry,) = [e for e in server.ledger.entries("alice").entries if e.kind == "hold"]
    assert entry.amount_micros == 50_000  # the bid, held
    printed = capsys.readouterr().out.split()
    assert printed[-1] == "0"  # alone in its batch: request_charge_micros 0
