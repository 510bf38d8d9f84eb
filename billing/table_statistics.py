"""The ledger's own `ANALYZE`, for a PostgreSQL server whose autovacuum is off.

psycopg prepares a statement on the server once it has run it a few times, and PostgreSQL, a
few executions of a prepared statement later, settles on one generic plan for it and keeps that
plan until something invalidates it: in practice an `ANALYZE` of a table it reads, which
autovacuum runs as a table changes. A ledger starts empty, so its statements are planned while
`holds` has a page or two, where reading the whole table costs less than its primary key. With
autovacuum on (PostgreSQL's default) the first automatic `ANALYZE`, a few dozen rows later, has
them planned again. With autovacuum off the statistics never change, the plans are never made
again, and every hold lookup reads the whole table, longer with every request: on the
development machine a group of 6 holds took 6 ms at 6,000 holds and 20 ms at 30,000
(`tests/billing/test_table_statistics.py` shows the plan; `docs/PERFORMANCE.md` the numbers).

So with autovacuum off the ledger's jobs do for its tables what autovacuum's analyze would
have: every `statistics_interval_seconds`, each ledger table changed by more than autovacuum's
own threshold since its last analyze (`autovacuum_analyze_threshold` rows plus
`autovacuum_analyze_scale_factor` of the table, from `pg_stat_user_tables`) is analyzed, which
has every plan that reads it made again (a table this server's role may not analyze, as one
with only `SELECT, INSERT, UPDATE, DELETE`, is left alone, with a warning once). With
autovacuum on, the job asks one setting and stops. Planning every statement afresh instead
(`plan_cache_mode = force_custom_plan`) was measured and left out: 0.89x the throughput at 20
connections on a small ledger.
"""

from __future__ import annotations

import functools
import logging

from sqlalchemy import Connection, Engine, text

__all__ = ["LEDGER_TABLES", "analyze_if_autovacuum_off", "stale_tables"]

log = logging.getLogger(__name__)

# Every table the serving path writes or reads by key.
LEDGER_TABLES = (
    "auction_batches",
    "auction_requests",
    "balances",
    "budgets",
    "holds",
    "ledger_entries",
    "users",
)

# Due tables, and whether this role may analyze each: PostgreSQL lets the table's owner, the
# database's owner and superusers (for whom `pg_has_role` is always true) analyze it.
_STALE_TABLES = text(
    """
    SELECT s.relname,
           pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE') AS allowed
    FROM pg_stat_user_tables AS s
    JOIN pg_class AS c ON c.oid = s.relid
    JOIN pg_database AS d ON d.datname = current_database()
    WHERE s.schemaname = current_schema()
      AND s.relname = ANY(:tables)
      AND s.n_mod_since_analyze > current_setting('autovacuum_analyze_threshold')::float8
          + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0)
    ORDER BY s.relname
    """
)


@functools.cache
def _warn_autovacuum_off() -> None:
    """Said once per process: the job runs every few seconds."""
    log.warning(
        "PostgreSQL's autovacuum is off: the ledger analyzes its own tables as they grow, so "
        "that lookups by key keep their index. Turn autovacuum on (`autovacuum = on` in "
        "postgresql.conf): nothing else removes dead rows."
    )


@functools.cache
def _warn_not_allowed(role: str) -> None:
    """Said once per process: the job would find the same tables due every time."""
    log.warning(
        "PostgreSQL's autovacuum is off and %s may not analyze the ledger's tables (only their "
        "owner, the database's owner or a superuser may): lookups will slow down as the "
        "ledger grows. Turn autovacuum on, or have the tables' owner run ANALYZE regularly.",
        role,
    )


def stale_tables(connection: Connection) -> dict[str, bool]:
    """The ledger tables that autovacuum would analyze now, by its own threshold, each with
    whether the connection's role may analyze it."""
    rows = connection.execute(_STALE_TABLES, {"tables": list(LEDGER_TABLES)})
    return {str(name): bool(allowed) for name, allowed in rows}


def analyze_if_autovacuum_off(engine: Engine) -> list[str]:
    """Analyze the ledger tables that are due when the server's autovacuum is off; returns
    them (none on SQLite, or with autovacuum on)."""
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as connection:
        if connection.scalar(text("SELECT current_setting('autovacuum')")) == "on":
            return []
        _warn_autovacuum_off()
        stale = stale_tables(connection)
        due = [table for table, allowed in stale.items() if allowed]
        for table in due:  # names from LEDGER_TABLES, never from outside
            connection.execute(text(f'ANALYZE "{table}"'))
        connection.commit()
    if due:
        log.info("analyzed %s", ", ".join(due))
    if len(due) < len(stale):
        _warn_not_allowed(engine.url.username or "the server's role")
    return due
