"""Small shared types: the "argument not given" sentinel and money and timeout aliases."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Final, Literal, TypeAlias, final

import httpx

__all__ = ["NOT_GIVEN", "Money", "NotGiven", "PacingMode", "Period", "TimeoutTypes"]


@final
class NotGiven:
    """Marks an argument the caller left out, so that `None` can keep its own meaning."""

    _instance: NotGiven | None = None

    def __new__(cls) -> NotGiven:
        # One instance, so identity checks and pickling round trips agree.
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"

    def __reduce__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Final = NotGiven()

# An amount of credits as the user writes it; converted exactly to integer micro-credits.
Money: TypeAlias = Decimal | str | int | float
# `None` disables timeouts; a float applies to every phase.
TimeoutTypes: TypeAlias = float | httpx.Timeout | None
PacingMode: TypeAlias = Literal["smooth", "asap"]
# A rolling window, or a calendar period aligned like the server's ledger periods (UTC).
Period: TypeAlias = timedelta | Literal["day", "week", "month"]
