"""The public surface of the package is exactly what we mean it to be."""

from __future__ import annotations

import subprocess
import sys

from inference_auctions import sdk


def test_all_is_sorted_and_complete() -> None:
    public = {name for name in dir(sdk) if not name.startswith("_")} | {"__version__"}
    assert sorted(sdk.__all__, key=str.casefold) == sorted(public, key=str.casefold)
    assert len(sdk.__all__) == len(set(sdk.__all__))


def test_all_is_sorted() -> None:
    # Constants, then classes, then functions and dunders, each group in code-point order.
    def key(name: str) -> tuple[bool, bool, str]:
        return (not name.isupper(), not name[:1].isupper(), name)

    assert sdk.__all__ == sorted(sdk.__all__, key=key)


def test_public_classes_live_in_the_package() -> None:
    for name in sdk.__all__:
        obj = getattr(sdk, name)
        if isinstance(obj, type):
            assert obj.__module__ == "inference_auctions.sdk", name


def test_sdk_never_imports_the_server() -> None:
    # A fresh interpreter: this test process may have imported the server for other tests.
    code = "import sys, inference_auctions.sdk; print(sorted(m for m in sys.modules if m in "
    code += "('inference_auctions.server', 'inference_auctions.billing', 'fastapi', 'sqlalchemy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_errors_share_one_base() -> None:
    for name in sdk.__all__:
        obj = getattr(sdk, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning):
            assert issubclass(obj, sdk.AuctionError), name
