"""Suite-wide guards."""

from __future__ import annotations

import sys

import pytest
from hypothesis import settings

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
