"""Every error body carries OpenAI's `code` for its failure, and errors.md lists each one."""

from __future__ import annotations

import re
from pathlib import Path

from inference_auctions.server import errors

ERRORS_MD = Path(__file__).resolve().parents[2] / "docs" / "reference" / "errors.md"


def _error_classes() -> list[type[errors.ServiceError]]:
    found: list[type[errors.ServiceError]] = []
    pending: list[type[errors.ServiceError]] = [errors.ServiceError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_body_has_a_code_beside_type_message_and_param() -> None:
    body = errors.RateLimited("slow down", param="x").body()
    assert body == {
        "error": {
            "type": "rate_limited",
            "message": "slow down",
            "param": "x",
            "code": "rate_limit_exceeded",
        }
    }
    assert errors.Unauthenticated("no").body()["error"]["code"] == "invalid_api_key"
    assert errors.PaymentRequired("poor").body()["error"]["code"] == "insufficient_quota"


def test_errors_md_gives_each_status_its_code() -> None:
    # A status may have several rows (404: `not_found`, `model_not_found`), one per type.
    rows = {
        (int(match[1]), match[2]): match[3]
        for match in re.finditer(
            r"^\| (\d{3}) \| `(\w+)` \|.*\| `(\w+)` \|$", ERRORS_MD.read_text(), re.MULTILINE
        )
    }
    for cls in _error_classes():
        if cls.status_code == 500 or cls is errors.ClientGone:
            continue  # no row: never sent (500) or never read (the client left)
        assert rows[(cls.status_code, cls.error_type)] == cls.code, cls.__name__
