"""The embedded default's shared cache: one SQLite file that every process of `make run` opens.

Without `REDIS_URL`, the two gunicorn workers, the Celery worker's children and beat are separate processes. A
cache private to each (Django's local-memory cache) keeps what one process invalidates alive in the others: the
order status versions bumped by the worker, the booking page generation bumped by beat, rate-limit counters.
This backend gives them one cache instead, with what the portal relies on holding across processes:

- `incr` is one `UPDATE … SET value = value + ? … RETURNING value`: SQLite runs it under its write lock, so
  concurrent increments from any number of processes never lose one (Django's database and file caches read,
  add and write back, which loses increments, and django-ratelimit refuses them for that reason);
- `add` is one `INSERT … ON CONFLICT DO UPDATE … WHERE <the existing entry expired>`: exactly one of several
  processes adding the same key wins;
- `set_many` writes in one `BEGIN IMMEDIATE` transaction and `get_many` reads in one statement, so a reader sees
  all of a `set_many` or none of it (the order versions one commit replaces);
- integers are stored as SQLite integers (so `incr` can add to them in SQL), everything else as JSON, as the
  Redis cache does (infrastructure/cache.py `JSONSerializer`): the development cache refuses what production's would.

The file is in WAL mode (readers never wait for the writer), `synchronous=NORMAL` (a cache may lose its last
writes on a power cut, never its consistency) and a busy timeout: a writer waits for another's lock instead of
failing. Each thread of each process has its own connection, opened again after a fork (a connection must
not cross `fork()`: gunicorn and Celery's prefork pool fork their workers). Expired entries are deleted every
`CULL_EVERY` writes of a process, and the oldest-expiring ones too when there are more than `MAX_ENTRIES`.

Not for production: the file is local to one machine, and SQLite serialises writers. Production uses Redis.
"""

import fcntl
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

BUSY_TIMEOUT_S = 5.0
CULL_EVERY = 200  # writes of one process between two sweeps of expired entries
_MAX_KEYS_PER_STATEMENT = 500  # far below SQLite's limit on bound parameters
_INT64 = range(-(2**63), 2**63)
_LIVE = "(expires IS NULL OR expires > ?)"  # not expired, at the time bound to its "?"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS cache_entry (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS cache_entry_expires ON cache_entry (expires)",
)
_UPSERT = (
    "INSERT INTO cache_entry (key, value, expires) VALUES (?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires = excluded.expires"
)


def _encode(value):
    # `type() is int`: a bool must come back as a bool, so it goes through JSON like any other value.
    if type(value) is int and value in _INT64:
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _decode(stored):
    if isinstance(stored, int):
        return stored
    return json.loads(stored)


class SQLiteCache(BaseCache):
    """`LOCATION` is the path of the SQLite file (created with its folder when missing)."""

    def __init__(self, location: str, params: dict) -> None:
        super().__init__(params)
        self._path = Path(location)
        self._local = threading.local()
        self._writes = 0

    # --- connection -----------------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            # First use in this thread, or a fork copied the parent's: open our own (the copy is left alone).
            local.connection = self._connect()
            local.pid = os.getpid()
        return local.connection

    def _connect(self) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: autocommit, each statement its own transaction unless BEGIN says otherwise.
        connection = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        connection.execute("PRAGMA synchronous = NORMAL")
        # Switching a new file to WAL and creating the table take locks SQLite's busy timeout does not wait for:
        # processes opening the file at once ("database is locked") take turns on a lock file instead.
        with open(self._path.with_name(self._path.name + ".lock"), "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    connection.execute("PRAGMA journal_mode = WAL")
                for statement in _SCHEMA:
                    connection.execute(statement)
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        return connection

    def _write_transaction(self, statement: str, rows) -> None:
        connection = self._connection()
        connection.execute("BEGIN IMMEDIATE")  # takes the write lock first: no read-then-upgrade deadlock
        try:
            connection.executemany(statement, rows)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def _expires(self, timeout) -> float | None:
        return self.get_backend_timeout(timeout)  # None: never; 0 or less: already expired

    def _wrote(self, count: int = 1) -> None:
        self._writes += count
        if self._writes >= CULL_EVERY:
            self._writes = 0
            self._cull()

    def _cull(self) -> None:
        connection = self._connection()
        connection.execute("DELETE FROM cache_entry WHERE expires <= ?", (time.time(),))
        (count,) = connection.execute("SELECT COUNT(*) FROM cache_entry").fetchone()
        if count > self._max_entries:
            if not self._cull_frequency:
                connection.execute("DELETE FROM cache_entry")
                return
            # Down to MAX_ENTRIES less a 1/CULL_FREQUENCY margin, the soonest to expire first, never-expiring last.
            connection.execute(
                "DELETE FROM cache_entry WHERE key IN "
                "(SELECT key FROM cache_entry ORDER BY expires IS NULL, expires LIMIT ?)",
                (count - self._max_entries + self._max_entries // self._cull_frequency,),
            )

    # --- the cache API --------------------------------------------------------------------------------------

    def get(self, key, default=None, version=None):
        key = self.make_and_validate_key(key, version=version)
        row = (
            self._connection()
            .execute(
                "SELECT value FROM cache_entry WHERE key = ? AND (expires IS NULL OR expires > ?)", (key, time.time())
            )
            .fetchone()
        )
        return default if row is None else _decode(row[0])

    def get_many(self, keys, version=None):
        names = {self.make_and_validate_key(key, version=version): key for key in keys}
        if not names:
            return {}
        connection = self._connection()
        chunks = [list(names)[i : i + _MAX_KEYS_PER_STATEMENT] for i in range(0, len(names), _MAX_KEYS_PER_STATEMENT)]
        found = {}
        if len(chunks) > 1:
            connection.execute("BEGIN")  # one read snapshot for all the chunks
        try:
            now = time.time()
            for chunk in chunks:
                placeholders = ", ".join("?" * len(chunk))  # only "?" is formatted into the query
                query = f"SELECT key, value FROM cache_entry WHERE {_LIVE} AND key IN ({placeholders})"  # noqa: S608
                rows = connection.execute(query, (now, *chunk)).fetchall()
                found.update((names[name], _decode(value)) for name, value in rows)
        finally:
            if len(chunks) > 1:
                connection.execute("COMMIT")
        return found

    def has_key(self, key, version=None):
        return self._live(self.make_and_validate_key(key, version=version))

    def set(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        key = self.make_and_validate_key(key, version=version)
        self._connection().execute(_UPSERT, (key, _encode(value), self._expires(timeout)))
        self._wrote()

    def set_many(self, data, timeout=DEFAULT_TIMEOUT, version=None):
        if data:
            expires = self._expires(timeout)
            rows = [(self.make_and_validate_key(key, version=version), _encode(v), expires) for key, v in data.items()]
            self._write_transaction(_UPSERT, rows)
            self._wrote(len(rows))
        return []

    def add(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        """Store `value` unless the key holds a live entry; True when stored. One statement: atomic."""
        key = self.make_and_validate_key(key, version=version)
        now = time.time()
        cursor = self._connection().execute(
            _UPSERT + " WHERE cache_entry.expires IS NOT NULL AND cache_entry.expires <= ?",
            (key, _encode(value), self._expires(timeout), now),
        )
        self._wrote()
        return cursor.rowcount == 1

    def incr(self, key, delta=1, version=None):
        """Add `delta` in one statement, keeping the entry's expiry; ValueError when the key is missing."""
        name, key = key, self.make_and_validate_key(key, version=version)
        rows = (
            self._connection()
            .execute(
                "UPDATE cache_entry SET value = value + ? "
                "WHERE key = ? AND (expires IS NULL OR expires > ?) AND typeof(value) = 'integer' RETURNING value",
                (delta, key, time.time()),
            )
            .fetchall()  # to the end: the statement (and its transaction) completes only then
        )
        if rows:
            return rows[0][0]
        if self._live(key):
            raise TypeError(f"Key '{name}' does not hold an integer")
        raise ValueError(f"Key '{name}' not found")

    def _live(self, key: str) -> bool:
        query = "SELECT 1 FROM cache_entry WHERE key = ? AND (expires IS NULL OR expires > ?)"
        return self._connection().execute(query, (key, time.time())).fetchone() is not None

    def touch(self, key, timeout=DEFAULT_TIMEOUT, version=None):
        key = self.make_and_validate_key(key, version=version)
        cursor = self._connection().execute(
            "UPDATE cache_entry SET expires = ? WHERE key = ? AND (expires IS NULL OR expires > ?)",
            (self._expires(timeout), key, time.time()),
        )
        return cursor.rowcount == 1

    def delete(self, key, version=None):
        key = self.make_and_validate_key(key, version=version)
        return self._connection().execute("DELETE FROM cache_entry WHERE key = ?", (key,)).rowcount == 1

    def delete_many(self, keys, version=None):
        rows = [(self.make_and_validate_key(key, version=version),) for key in keys]
        if rows:
            self._write_transaction("DELETE FROM cache_entry WHERE key = ?", rows)

    def clear(self):
        self._connection().execute("DELETE FROM cache_entry")
