"""The psycopg connection the ledger opens to PostgreSQL: a transaction's `BEGIN` travels with
the statements after it.

psycopg starts a transaction implicitly, with a `BEGIN` before the first statement; in
pipeline mode it then sends a Sync and waits for the server's answer before anything else, so
that its view of the transaction status stays right even when a result is fetched before the
pipeline ends. A group commit (`billing.group_commit`) begins with all its reads in one
pipeline and fetches nothing before that pipeline's end, so the wait buys it nothing and costs
a round trip to the server on every commit: a quarter of a lone request's settlement.

`LedgerConnection` leaves the Sync out inside a pipeline. The statements queued after the
`BEGIN` see the connection busy (libpq reports a transaction in progress while results are
due), so none of them begins again; the pipeline's own Sync at its end makes the status
right. Were a result fetched in the middle of a pipeline, the next statement could send a
second `BEGIN`, which PostgreSQL answers with a warning and ignores: nothing is lost either
way. Outside a pipeline, and in autocommit mode, nothing changes.

This overrides psycopg's private `_start_query`: `tests/billing/test_postgres_connection.py`
counts the round trips of a transaction's first pipeline and its `BEGIN`s, and
`tests/billing/test_deferred_writes.py` a settlement's, so a psycopg release that changes it
fails there rather than quietly.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import pq
from psycopg.abc import PQGen

__all__ = ["LedgerConnection", "quiet_lost_pipelines"]


class _LostPipelines(logging.Filter):
    """Drops psycopg's "error ignored terminating <Pipeline>" for a connection that was lost:
    the error of the block it ended is raised (and the ledger says in one line that the
    connection was replaced), so this second line for the same loss says nothing more."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("error ignored terminating"):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(a, psycopg.OperationalError) for a in args)


_FILTER = _LostPipelines()


def quiet_lost_pipelines() -> None:
    """Install `_LostPipelines` on psycopg's logger (once, whoever calls)."""
    psycopg_logger = logging.getLogger("psycopg")
    if _FILTER not in psycopg_logger.filters:
        psycopg_logger.addFilter(_FILTER)


class LedgerConnection(psycopg.Connection[Any]):
    """psycopg's connection, without the wait after an implicit `BEGIN` in a pipeline."""

    def _start_query(self) -> PQGen[None]:
        if self._pipeline is None:
            yield from super()._start_query()
            return
        if self._autocommit or self.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return
        yield from self._exec_command(self._get_tx_start_command())
