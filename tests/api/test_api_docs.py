"""`/docs` works without internet: the page and every file it loads come from this server."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.db_fixtures import migrated_database
from tests.server.harness import running_server


def test_the_api_docs_load_whole_from_the_server_itself(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as db, running_server(db) as server:
        page = httpx.get(server.url + "/docs", timeout=30)
        assert page.status_code == 200
        assert "SwaggerUIBundle" in page.text
        links = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
        links += re.findall(r"""url: ?["']([^"']+)["']""", page.text)  # the schema
        assert not [link for link in links if "//" in link], links  # no CDN, no other origin
        assert {"/openapi.json", "/docs/assets/swagger-ui-bundle.js"} <= set(links)
        assert "/docs/assets/swagger-ui.css" in links
        for link in links:
            reply = httpx.get(server.url + link, timeout=30)
            assert reply.status_code == 200, link
            assert len(reply.content) > 100, link
        script = httpx.get(server.url + "/docs/assets/swagger-ui-bundle.js", timeout=30)
        assert script.headers["content-type"].startswith("text/javascript")
        assert httpx.get(server.url + "/docs/assets/nothing.js", timeout=30).status_code == 404
        assert httpx.get(server.url + "/redoc", timeout=30).status_code == 404  # it used a CDN
