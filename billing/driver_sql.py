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

On PostgreSQL every statement is a round trip to the server, and on a busy two-core machine a
round trip costs more than the statement. A group commit (`Ledger.commit_group`) therefore
reads what it needs first, all in one round trip with the `BEGIN` (`read_together`;
`billing.postgres_connection`), and then defers its writes (`defer_writes`): they are kept
here and sent all together with the next read or, usually, just before the `COMMIT`, so
that the whole transaction takes three round trips instead of seven. Three engine events
keep that exact (`watch_engine`): any other statement on the connection (the ORM's, a
savepoint's) first sends what is deferred, so statements still reach the server in the
order they were issued; the commit sends them, and waits for every one to succeed, before
its `COMMIT`; a rollback drops them unsent.

The `COMMIT` is never sent together with the writes: a server blocked on a row lock in one
of them would, once the lock is released, go on to the `COMMIT` already in its buffer even
if the client had died meanwhile, and commit a transaction nobody is left to follow up on.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from operator import itemgetter
from typing import Any, Literal, NamedTuple, cast

from sqlalchemy import Column, Connection, Dialect, Engine, Table, event
from sqlalchemy.engine.interfaces import DBAPIModule
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Session

__all__ = ["Columns", "Conversion", "DriverCursor", "Query", "driver_cursor", "watch_engine"]

Processor = Callable[[Any], Any]

_CURSOR_KEY = "inference_auctions.driver_cursor"

# The cursor whose writes are deferred, per SQLAlchemy connection (one per transaction of a
# `Session`): what the engine events of `watch_engine` look at. Weak, so that a connection
# that ends without a commit or a rollback (invalidated) takes its entry with it.
_DEFERRING: weakref.WeakKeyDictionary[Connection, DriverCursor] = weakref.WeakKeyDictionary()


class Query(NamedTuple):
    """A read for `DriverCursor.read_together`: SQL, parameters, and how many values its
    `{in}` lists."""

    sql: str
    params: Sequence[Any]
    listed: int = 0


class _Statement(NamedTuple):
    """A statement rendered for the driver; `many`: `params` is a sequence of rows, the
    statement runs once per row."""

    statement: str
    params: Any
    many: bool = False


@dataclass(frozen=True, slots=True)
class Columns:
    """Some columns of one table, in order, with their conversions for one dialect."""

    table: Table
    names: tuple[str, ...]

    def quoted(self, dialect: Dialect) -> list[str]:
        """The column names as the dialect must spell them."""
        return [dialect.identifier_preparer.quote(name) for name in self.names]

    def bind_processors(self, dialect: Dialect) -> list[Processor | None]:
        """Each column's processor of a Python value into the driver's (None: as it is),
        remembering its last value (`Conversion`)."""
        return [_processor(_column(self.table, name), dialect, "bind") for name in self.names]

    def result_processors(self, dialect: Dialect) -> list[Processor | None]:
        """Each column's processor of the driver's value into the Python value, remembering
        its last value (`Conversion`)."""
        return [_processor(_column(self.table, name), dialect, "result") for name in self.names]

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

    Most columns (integers, strings) have none and are passed over without a call. The
    processors come from `Columns`, each remembering its last value and result: a group
    commit writes the same timestamp (its `now`) and the same few enum members into most of
    its rows, and formatting a timestamp for SQLite costs more than the rest of the row.
    """

    __slots__ = ("_active",)

    def __init__(self, processors: Iterable[Processor | None]) -> None:
        self._active = tuple(
            (index, process) for index, process in enumerate(processors) if process is not None
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


# Processors of parameterless types (the timestamps), one per type, dialect and direction, so
# that the group commit's `now` is formatted once for all the tables it writes, not once per
# table. A type with parameters (an enum's members, a boolean's constraint) gets its own.
_SHARED: dict[tuple[type[Any], str, str], Processor | None] = {}


def _processor(
    column: Column[Any], dialect: Dialect, direction: Literal["bind", "result"]
) -> Processor | None:
    kind = column.type
    key = (type(kind), dialect.name, direction)
    # SQLAlchemy's own cache key of the type: just its class when nothing else configures it.
    shared = getattr(kind, "_static_cache_key", None) == (type(kind),)
    if shared and key in _SHARED:
        return _SHARED[key]
    implementation = kind.dialect_impl(dialect)
    process = (
        implementation.bind_processor(dialect)
        if direction == "bind"
        else implementation.result_processor(dialect, None)
    )
    remembered = None if process is None else _remembering(process)
    if shared:
        _SHARED[key] = remembered
    return remembered


class DriverCursor:
    """Statements on the connection of one `Session`'s transaction (see the module docstring).

    Statements are written with `?` placeholders and `{in}` for a list of values; the class
    renders them for the driver (`?` for SQLite, `%s` for psycopg) and caches the rendering.
    Each statement gets a driver cursor of its own, closed before the call returns, as
    SQLAlchemy does: a cursor left open would be finalized by the garbage collector whenever
    it runs, in any thread, possibly while another transaction uses the same pooled
    connection (SQLite then reports "bad parameter or other API misuse").
    """

    def __init__(self, connection: Connection) -> None:
        self._pipelined: Any = None  # the cursor of a `together` block, while one runs
        self._deferred: list[_Statement] | None = None  # writes held back (`defer_writes`)
        self._connection = connection
        self.dialect = connection.dialect
        dbapi_connection = connection.connection.dbapi_connection
        assert dbapi_connection is not None
        self._dbapi_connection = dbapi_connection
        self._placeholder = "?" if self.dialect.paramstyle == "qmark" else "%s"
        self._dbapi_error: type[DBAPIModule.Error] = self.dialect.loaded_dbapi.Error

    @property
    def _pipelines(self) -> bool:
        """Whether statements can be sent without waiting for each answer (PostgreSQL)."""
        return self.dialect.name == "postgresql"

    def defer_writes(self) -> None:
        """From now until the transaction ends, hold the writes back and send them with the
        next read or before the `COMMIT` (see the module docstring). An error of a deferred
        write is raised by that read or by the commit. Only on PostgreSQL, and only on an
        engine that `watch_engine` watches; elsewhere writes run at once, as before."""
        if not self._pipelines or self._deferred is not None:
            return
        if not event.contains(self._connection.engine, "commit", _send_with_commit):
            return
        self._deferred = []
        _DEFERRING[self._connection] = self

    def read_together(self, queries: Sequence[Query]) -> list[list[Any]]:
        """Run reads (and any deferred writes before them) in one round trip: the rows of
        each query, in order. On SQLite they simply run one by one."""
        if not queries:
            return []
        if not self._pipelines or self._pipelined is not None:
            return [self.execute(query.sql, query.params, query.listed) for query in queries]
        rendered = [
            _Statement(self.render(query.sql, query.listed), query.params) for query in queries
        ]
        return self._send(rendered)

    def send_deferred(self) -> None:
        """Send the deferred writes now (one round trip), before a statement of another
        path runs on the same connection."""
        if self._deferred:
            self._send([])

    def commit_deferred(self) -> None:
        """The transaction commits: send the deferred writes (one round trip) and return
        once every one of them has succeeded; the driver's `COMMIT` follows."""
        _DEFERRING.pop(self._connection, None)
        if self._deferred:
            self._send([])
        self._deferred = None

    def drop_deferred(self) -> None:
        """The transaction rolls back: the deferred writes are never sent."""
        _DEFERRING.pop(self._connection, None)
        self._deferred = None

    def _send(self, reads: Sequence[_Statement]) -> list[list[Any]]:
        """Deferred writes, then `reads`, in one pipeline; the rows of each read (of every
        run of a read with many rows of parameters)."""
        writes = self._deferred or []
        if self._deferred is not None:
            self._deferred = []
        connection = self._dbapi_connection
        cursor = connection.cursor()
        readers: list[Any] = [connection.cursor() for _ in reads]  # psycopg cursors
        try:
            with connection.pipeline():
                for write in writes:
                    if write.many:
                        cursor.executemany(write.statement, write.params)
                    else:
                        cursor.execute(write.statement, write.params)
                for reader, read in zip(readers, reads, strict=True):
                    if read.many:
                        reader.executemany(read.statement, read.params, returning=True)
                    else:
                        reader.execute(read.statement, read.params)
            # The pipeline's sync at the end of the block received every result.
            return [_all_rows(reader) for reader in readers]
        except self._dbapi_error as error:
            what = "(statements sent together)"
            raise self._translated(error, what, None, cursor, many=True) from error
        finally:
            for each in (cursor, *readers):
                each.close()

    @contextmanager
    def together(self) -> Iterator[None]:
        """Send the statements of the block without waiting for each one's answer: one round
        trip to the server for all of them (psycopg's pipeline mode). Only for statements
        whose rows are not read inside; an error of any of them is raised at the end of the
        block. SQLite runs in this process, so there the statements simply run one by one.
        With writes deferred, the block adds nothing: they all wait for the next read."""
        if not self._pipelines or self._pipelined is not None or self._deferred is not None:
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
        """Run one statement (rendered with `count` list placeholders); its rows, if any.
        Deferred writes are sent before it, in the same round trip."""
        if self._deferred:
            [rows] = self._send([_Statement(self.render(sql, count), params)])
            return rows
        return self._run(self.render(sql, count), params, many=False)

    def execute_many_returning(self, sql: str, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """Run a statement with RETURNING once per row of parameters; the rows all of them
        returned. On PostgreSQL one round trip, deferred writes before it in the same one."""
        if self._pipelined is not None:
            raise RuntimeError("a together() block reads no rows: run this outside it")
        if not rows:
            return []
        statement = _Statement(self.render(sql), rows, many=True)
        if self._pipelines:
            [returned] = self._send([statement])
            return returned
        # SQLite's driver returns no rows from executemany; it runs in this process anyway.
        return [
            row for params in rows for row in self._run(statement.statement, params, many=False)
        ]

    def write(self, sql: str, params: Sequence[Any] = (), count: int = 0) -> None:
        """Run one statement whose rows are not read (deferred while writes are)."""
        statement = self.render(sql, count)
        if self._deferred is not None:
            self._deferred.append(_Statement(statement, params, many=False))
        else:
            self._run(statement, params, many=False)

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row of parameters, as one driver call (deferred while
        writes are)."""
        if not rows:
            return
        if self._deferred is not None:
            self._deferred.append(_Statement(self.render(sql), rows, many=True))
        else:
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


def _all_rows(cursor: Any) -> list[Any]:
    """Every row of every result the cursor holds (one per run of an executemany)."""
    rows = list(cursor.fetchall()) if cursor.description is not None else []
    while cursor.nextset():
        if cursor.description is not None:
            rows += cursor.fetchall()
    return rows


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
    cursor = DriverCursor(session.connection())  # begins the transaction if none has begun
    session.info[_CURSOR_KEY] = (session.get_transaction(), cursor)
    return cursor


def watch_engine(engine: Engine) -> None:
    """Let transactions on `engine` defer their driver writes (`DriverCursor.defer_writes`):
    the three events that keep deferred writes in order, sent with the commit and dropped by
    a rollback. Idempotent."""
    if event.contains(engine, "commit", _send_with_commit):
        return
    event.listen(engine, "before_cursor_execute", _send_before_statement)
    event.listen(engine, "commit", _send_with_commit)
    event.listen(engine, "rollback", _drop_on_rollback)


def _send_before_statement(connection: Connection, *_: Any) -> None:
    # Another path's statement (the ORM's, a savepoint's) must find the deferred writes done.
    cursor = _DEFERRING.get(connection)
    if cursor is not None:
        cursor.send_deferred()


def _send_with_commit(connection: Connection) -> None:
    # Before the driver's COMMIT (the `commit` event fires first).
    cursor = _DEFERRING.get(connection)
    if cursor is not None:
        cursor.commit_deferred()


def _drop_on_rollback(connection: Connection) -> None:
    cursor = _DEFERRING.get(connection)
    if cursor is not None:
        cursor.drop_deferred()
