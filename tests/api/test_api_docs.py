"""`/docs` works without internet: the page and every file it loads come from this server, and
a real browser shows the operations of the OpenAPI 3.1 schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.dashboard.chromium import chromium, require_browser
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


@pytest.mark.browser
def test_the_api_docs_render_every_operation_in_a_real_browser(tmp_path: Path) -> None:
    """Swagger UI before version 5 loads its files and then shows "Unable to render this
    definition" for FastAPI's OpenAPI 3.1: the operations must be on the page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    require_browser()
    with (
        migrated_database("sqlite", tmp_path) as db,
        running_server(db) as server,
        chromium() as driver,
    ):
        schema = httpx.get(server.url + "/openapi.json", timeout=30).json()
        assert schema["openapi"].startswith("3.1")
        driver.get(server.url + "/docs")
        WebDriverWait(driver, 30, poll_frequency=0.1).until(
            lambda d: (
                d.find_elements(By.CSS_SELECTOR, ".opblock")
                or "Unable to render" in d.find_element(By.TAG_NAME, "body").text
            )
        )
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "Unable to render" not in body
        shown = {
            element.get_attribute("data-path")
            for element in driver.find_elements(
                By.CSS_SELECTOR, ".opblock-summary-path, .opblock-summary-path__deprecated"
            )
        }
        assert set(schema["paths"]) <= shown, set(schema["paths"]) - shown
        generate = driver.find_element(
            By.CSS_SELECTOR, ".opblock-summary-path[data-path='/generate']"
        )
        assert generate.is_displayed()
        assert schema["paths"]["/generate"]["post"]["summary"] in body
        requested = [
            json.loads(entry["message"])["message"]["params"]["request"]["url"]
            for entry in driver.get_log("performance")
            if '"Network.requestWillBeSent"' in entry["message"]
        ]
        # The browser's own pages (chrome://, data:) aside, every file came from this server.
        fetched = [url for url in requested if url.startswith(("http:", "https:"))]
        assert server.url + "/docs/assets/swagger-ui-bundle.js" in fetched
        assert all(url.startswith(server.url) for url in fetched), fetched
