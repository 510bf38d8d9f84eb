"""Whether PostgreSQL's autovacuum looks after the ledger's tables: said once, at start-up.

Autovacuum removes the dead rows every update of a balance or a hold leaves behind, and its
`ANALYZE` is what has PostgreSQL plan the ledger's prepared statements again as the tables
grow: a plan made while `holds` was a page or two reads the whole table, and without a new
`ANALYZE` it is kept, so every hold lookup slows down with every request. The ledger does not
make up for it; a server started where autovacuum is off, for the whole database server or for
one of the ledger's tables (`autovacuum_enabled = false`), says so in one WARNING line, and
docs/operations/postgresql.md says what to do.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, text

from inference_auctions.billing.models import Base

__all__ = ["SERVER", "autovacuum_gaps", "warn_if_autovacuum_off", "warning_line"]

log = logging.getLogger(__name__)

SERVER = "the database server"

# The ledger's tables whose own setting turns autovacuum off, in this schema.
_TABLES_OFF = text(
    """
    SELECT c.relname
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    CROSS JOIN LATERAL pg_options_to_table(c.reloptions) AS o
    WHERE n.nspname = current_schema()
      AND c.relname = ANY(:tables)
      AND o.option_name = 'autovacuum_enabled'
      AND NOT o.option_value::boolean
    ORDER BY c.relname
    """
)


def autovacuum_gaps(connection: Connection) -> list[str]:
    """Where autovacuum is off for the ledger: `SERVER` (`SHOW autovacuum` says off), then
    each ledger table whose own setting turns it off. None on SQLite."""
    if connection.dialect.name != "postgresql":
        return []
    gaps = [] if connection.scalar(text("SHOW autovacuum")) == "on" else [SERVER]
    tables = sorted(Base.metadata.tables)
    gaps += [str(name) for name in connection.scalars(_TABLES_OFF, {"tables": tables})]
    return gaps


def warning_line(gaps: list[str]) -> str | None:
    """The one WARNING line for `gaps` (`autovacuum_gaps`); None when there are none."""
    if not gaps:
        return None
    if gaps[0] == SERVER:
        where = "on the database server" + (f" and for {', '.join(gaps[1:])}" if gaps[1:] else "")
        fix = "set `autovacuum = on` in postgresql.conf and reload"
    else:
        where = f"for the ledger's table {', '.join(gaps)}"
        fix = "run `ALTER TABLE <table> RESET (autovacuum_enabled)`"
    return (
        f"PostgreSQL's autovacuum is off {where}: {fix}; without it dead rows pile up and "
        "the ledger's lookups slow down as its tables grow (docs/operations/postgresql.md)"
    )


def warn_if_autovacuum_off(connection: Connection) -> list[str]:
    """Log `warning_line` where autovacuum is off for the ledger; returns the gaps."""
    gaps = autovacuum_gaps(connection)
    line = warning_line(gaps)
    if line is not None:
        log.warning(line)
    return gaps
