"""The connection guard overrides private parts of uvicorn: a uvicorn that changes them must fail
here, with a message naming the hook, not in production with an obscure error."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from pathlib import Path
from tomllib import loads
from typing import Any

import pytest
import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from inference_auctions.server.api.connections import UVICORN_HOOKS, check_uvicorn_hooks

# The instance attributes of uvicorn's protocol that the guard reads or sets.
PROTOCOL_ATTRIBUTES = ("connections", "cycle", "transport", "parser", "app")


def test_the_installed_uvicorn_has_every_hook_the_guard_overrides() -> None:
    check_uvicorn_hooks()  # raises, naming the hook, if one changed
    # And the attributes set by its constructor.
    config = uvicorn.Config(app=_app, http="httptools", lifespan="off")
    config.load()
    loop = asyncio.new_event_loop()
    try:
        protocol = HttpToolsProtocol(config, ServerState(), app_state={}, _loop=loop)
    finally:
        loop.close()
    missing = [name for name in PROTOCOL_ATTRIBUTES if not hasattr(protocol, name)]
    assert not missing, (
        f"uvicorn {uvicorn.__version__}'s HttpToolsProtocol has no {missing}, which the "
        "connection guard (server.api.connections) uses"
    )


def test_a_changed_hook_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class Renamed(HttpToolsProtocol):
        _start_asgi_task = None  # type: ignore[assignment]  # as if a release removed it

    with pytest.raises(RuntimeError, match=r"HttpToolsProtocol\._start_asgi_task"):
        check_uvicorn_hooks(Renamed)

    class Reshaped(HttpToolsProtocol):
        def connection_made(self, transport: Any, extra: Any = None) -> None:  # type: ignore[override]
            pass

    with pytest.raises(RuntimeError, match=r"HttpToolsProtocol\.connection_made") as error:
        check_uvicorn_hooks(Reshaped)
    assert "expected parameters ('self', 'transport')" in str(error.value)


def test_the_declared_bound_admits_the_tested_version_only() -> None:
    """pyproject.toml bounds uvicorn to the minor version these tests run on: a newer one is
    installed only after this file has passed on it and the bound moved."""
    project = loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    declared = next(
        Requirement(d) for d in project["project"]["dependencies"] if d.startswith("uvicorn")
    )
    installed = version("uvicorn")
    assert declared.specifier.contains(installed), (installed, str(declared.specifier))
    assert any(spec.operator == "<" for spec in declared.specifier), "uvicorn needs an upper bound"
    assert set(UVICORN_HOOKS) >= {"_start_asgi_task", "connection_made"}


async def _app(scope: Any, receive: Any, send: Any) -> None:
    return None
