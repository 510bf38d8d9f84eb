"""A path no route serves is a 404 that names the route a client of SGLang or OpenAI most
likely meant, against a real server."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.db_fixtures import migrated_database
from tests.server.harness import running_server


def test_a_mistaken_path_is_a_404_that_names_the_route_meant(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as db, running_server(db) as server:
        key = server.create_user("alice")
        headers = {"Authorization": f"Bearer {key}"}
        cases = {
            ("POST", "/v1/generate"): "did you mean /generate?",
            ("POST", "/chat/completions"): "did you mean /v1/chat/completions?",
            ("GET", "/v1/balance"): "did you mean /v1/ledger/balance?",
            ("GET", "/nothing/here"): "",
        }
        for (method, path), hint in cases.items():
            reply = httpx.request(
                method, server.url + path, json={"text": "hi"}, headers=headers, timeout=30
            )
            assert reply.status_code == 404, (path, reply.text)
            error = reply.json()["error"]
            assert error["type"] == "not_found"
            assert f"this server has no route {path!r}" in error["message"]
            assert hint in error["message"] and "every route is at /docs" in error["message"]
            assert ("did you mean" in error["message"]) == bool(hint)
        # A route's own 404 keeps its message.
        missing = httpx.get(server.url + "/docs/assets/nothing.js", timeout=30)
        assert missing.status_code == 404
        assert missing.json()["error"]["message"] == "the API docs have no file 'nothing.js'"
