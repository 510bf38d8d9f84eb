"""The serving path's hottest statements, sent to the database driver directly.

A settlement, a group of holds and a group of served records run several hundred times a
second under load, each a handful of small statements. Through SQLAlchemy, executing one of
them costs 10-30 µs of CPU in the execution context, parameter compilation (an expanding
`IN` is rendered anew on every call) and result wrapping, several times what SQLite or
PostgreSQL spend on the statement itself. So these few statements are rendered once per
dialect as the driver's SQL text and run on the cursor of the transaction's own connection:
same transaction, same locks, same savepoints as the surrounding `Session`.

Values still go through SQLAlchemy's own type conversion, fetched once per column
(`TypeEngine.bind_processor` / `result_processor`), so a timestamp, an enum or a boolean is
stored and read exactly as the ORM and Core paths store and read it; a driver error is
raised as SQLAlchemy's `DBAPIError` subclass, as `Connection.execute` would raise it, so the
ledger's retry and "unavailable" handling applies unchanged (and a lost connection is
invalidated, not returned to the pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from operator import itemgetter
from typing import Any, cast

from sqlalchemy import Column, Dialect, Table
from sqlalchemy.engine.interfaces import DBAPIModule
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Session

__all__ = ["Columns", "Conversion", "DriverCursor", "driver_cursor"]

Processor = Callable[[Any], Any]

_CURSOR_KEY = "inference_auctions.driver_cursor"


@dataclass(frozen=True, slots=True)
class Columns:
    """Some columns of one table, in order, with their conversions for one dialect."""

    table: Table
    names: tuple[str, ...]

    def quoted(self, dialect: Dialect) -> list[str]:
        """The column names as the dialect must spell them."""
        return [dialect.identifier_preparer.quote(name) for name in self.names]

    def bind_processors(self, dialect: Dialect) -> list[Processor | None]:
        """Each column's processor of a Python value into the driver's (None: as it is)."""
        return [
            _column(self.table, name).type.dialect_impl(dialect).bind_processor(dialect)
            for name in self.names
        ]

    def result_processors(self, dialect: Dialect) -> list[Processor | None]:
        """Each column's processor of the driver's value into the Python value."""
        return [
            _column(self.table, name).type.dialect_impl(dialect).result_processor(dialect, None)
            for name in self.names
        ]

    @cache  # noqa: B019 (a few module-level instances, each asked for one or two dialects)
    def bind(self, dialect: Dialect) -> Conversion:
        """The columns' conversion of Python values into the driver's."""
        return Conversion(self.bind_processors(dialect))

    @cache  # noqa: B019 (see `bind`)
    def result(self, dialect: Dialect) -> Conversion:
        """The columns' conversion of the driver's values into Python values."""
        return Conversion(self.result_processors(dialect))


class Conversion:
    """Converts a row of values column by column, through SQLAlchemy's type processors.

    Most columns (integers, strings) have none and are passed over without a call. A
    processor remembers its last value and result: a group commit writes the same timestamp
    (its `now`) and the same few enum members into most of its rows, and formatting a
    timestamp for SQLite costs more than the rest of the row.
    """

    __slots__ = ("_active",)

    def __init__(self, processors: Iterable[Processor | None]) -> None:
        self._active = tuple(
            (index, _remembering(process))
            for index, process in enumerate(processors)
            if process is not None
        )

    def __call__(self, values: Iterable[Any]) -> list[Any]:
        """The row converted (None stays None), as a new list."""
        row = list(values)
        for index, process in self._active:
            value = row[index]
            if value is not None:
                row[index] = process(value)
        return row


_NOTHING = object()


def _remembering(process: Processor) -> Processor:
    """`process`, answering a repeat of its last value (the same object) from memory."""
    last: tuple[Any, Any] = (_NOTHING, None)

    def remembered(value: Any) -> Any:
        nonlocal last
        seen, converted = last  # one tuple, so a concurrent caller never sees half of it
        if seen is value:
            return converted
        converted = process(value)
        last = (value, converted)
        return converted

    return remembered


def _column(table: Table, name: str) -> Column[Any]:
    return table.c[name]


class DriverCursor:
    """Statements on the connection of one `Session`'s transaction (see the module docstring).

    Statements are written with `?` placeholders and `{in}` for a list of values; the class
    renders them for the driver (`?` for SQLite, `%s` for psycopg) and caches the rendering.
    Each statement gets a driver cursor of its own, closed before the call returns, as
    SQLAlchemy does: a cursor left open would be finalized by the garbage collector whenever
    it runs, in any thread, possibly while another transaction uses the same pooled
    connection (SQLite then reports "bad parameter or other API misuse").
    """

    def __init__(self, session: Session) -> None:
        self._pipelined: Any = None  # the cursor of a `together` block, while one runs
        connection = session.connection()
        self._connection = connection
        self.dialect = connection.dialect
        dbapi_connection = connection.connection.dbapi_connection
        assert dbapi_connection is not None
        self._dbapi_connection = dbapi_connection
        self._placeholder = "?" if self.dialect.paramstyle == "qmark" else "%s"
        self._dbapi_error: type[DBAPIModule.Error] = self.dialect.loaded_dbapi.Error

    @contextmanager
    def together(self) -> Iterator[None]:
        """Send the statements of the block without waiting for each one's answer: one round
        trip to the server for all of them (psycopg's pipeline mode). Only for statements
        whose rows are not read inside; an error of any of them is raised at the end of the
        block. SQLite runs in this process, so there the statements simply run one by one."""
        if self.dialect.name != "postgresql" or self._pipelined is not None:
            yield
            return
        cursor = self._dbapi_connection.cursor()
        try:
            with self._dbapi_connection.pipeline():
                self._pipelined = cursor
                yield
        except self._dbapi_error as error:
            translated = self._translated(
                error, "(statements sent together)", None, cursor, many=True
            )
            raise translated from error
        finally:
            self._pipelined = None
            cursor.close()

    def render(self, sql: str, count: int = 0) -> str:
        """`sql` with the driver's placeholders; `{in}` becomes `count` of them."""
        return _render(sql, self._placeholder, count)

    def execute(self, sql: str, params: Sequence[Any] = (), count: int = 0) -> list[Any]:
        """Run one statement (rendered with `count` list placeholders); its rows, if any."""
        return self._run(self.render(sql, count), params, many=False)

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row of parameters, as one driver call."""
        if rows:
            self._run(self.render(sql), rows, many=True)

    def insert(self, columns: Columns, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert row dicts (keyed by `columns.names`) into the columns' table, one call."""
        if not rows:
            return
        sql, binds, values = _insert_plan(columns, self.dialect)
        self.execute_many(sql, [binds(values(row)) for row in rows])

    def _run(self, statement: str, params: Any, *, many: bool) -> list[Any]:
        if self._pipelined is not None:  # answered at the end of the `together` block
            if many:
                self._pipelined.executemany(statement, params)
            else:
                self._pipelined.execute(statement, params)
            return []
        cursor = self._dbapi_connection.cursor()
        try:
            if many:
                cursor.executemany(statement, params)
                return []
            cursor.execute(statement, params)
            return list(cursor.fetchall()) if cursor.description is not None else []
        except self._dbapi_error as error:
            raise self._translated(error, statement, params, cursor, many=many) from error
        finally:
            cursor.close()

    def _translated(
        self, error: DBAPIModule.Error, statement: str, params: Any, cursor: Any, *, many: bool
    ) -> StatementError:
        """The driver's error as `Connection.execute` raises it; a lost connection is
        invalidated, so that it never goes back to the pool."""
        lost = self.dialect.is_disconnect(error, self._dbapi_connection, cursor)
        if lost:
            self._connection.invalidate(error)
        return DBAPIError.instance(
            statement,
            params,
            error,
            self._dbapi_error,
            connection_invalidated=lost,
            dialect=self.dialect,
            ismulti=many,
        )


@cache
def _insert_plan(
    columns: Columns, dialect: Dialect
) -> tuple[str, Conversion, Callable[[Mapping[str, Any]], Iterable[Any]]]:
    table = dialect.identifier_preparer.quote(columns.table.name)
    names = columns.quoted(dialect)
    sql = f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(['?'] * len(names))})"
    getter = itemgetter(*columns.names)
    # An itemgetter of one name gives the value itself, not a tuple of it.
    values: Callable[[Mapping[str, Any]], Iterable[Any]] = (
        getter if len(columns.names) > 1 else lambda row: (getter(row),)
    )
    return sql, columns.bind(dialect), values


@cache
def _render(sql: str, placeholder: str, count: int) -> str:
    listed = ", ".join([placeholder] * count)
    rendered = sql.replace("?", placeholder)
    return rendered.replace("{in}", listed) if "{in}" in rendered else rendered


def driver_cursor(session: Session) -> DriverCursor:
    """The driver cursor of `session`'s current transaction, made once per transaction (a
    session that commits and begins again may be given another pooled connection)."""
    cached = session.info.get(_CURSOR_KEY)
    transaction = session.get_transaction()
    if cached is not None and transaction is not None and cached[0] is transaction:
        return cast(DriverCursor, cached[1])
    cursor = DriverCursor(session)  # begins the transaction if none has begun
    session.info[_CURSOR_KEY] = (session.get_transaction(), cursor)
    return cursor
