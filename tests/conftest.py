"""Suite-wide guards."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import settings

from tests.virtual_time import VirtualTimeLoop

# The repository's folders are importable from its root under their bare names too; only the
# namespaced names are the product's, and a module imported twice under two names has two
# copies of its state (settings, monkeypatches), so no test may use the bare ones.
_BARE_NAMES = ("server", "billing", "sdk", "migrations", "experiments")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bare = sorted(name for name in sys.modules if name.split(".")[0] in _BARE_NAMES)
    if bare:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nimported under bare (non-namespaced) names: {bare[:10]}", file=sys.stderr)


# Property tests check results, not speed: a shared CI machine must not fail them on a deadline.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "virtual_time: an `anyio` test on an event loop whose clock jumps to its next timer"
        " (tests/virtual_time.py)",
    )


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> str | tuple[str, dict[str, Any]]:
    """Async tests (marked `anyio`) run on asyncio, the server's event loop; on a virtual clock
    when also marked `virtual_time`."""
    if request.node.get_closest_marker("virtual_time") is not None:
        return "asyncio", {"loop_factory": VirtualTimeLoop}
    return "asyncio"
