"""Where a study lives: the `--storage` URL, opening it safely, and its failures as one message.

A study is Optuna's RDB storage: a local SQLite file by default, or a database server (PostgreSQL)
that several identical hosts share. This module is the one place that turns a `--storage` URL into
an open storage:

- `resolve_storage_url`: the plain `postgresql://` (and `postgres://`) form names the installed driver
  (psycopg 3, from `pip install torchpace[postgres]`, else psycopg2);
- bounded waits: a server connection gives up after `connect_timeout` (default 10 s), an SQLite
  lock after `timeout` (default 60 s); either can be set in the URL's query;
- `check_storage`: refuses, before anything is written, a URL that cannot be reached (the URL named
  with its password masked) and a database that holds tables other than Optuna's (an application's
  database is never given Optuna's tables);
- `storage_failures`: a database error while tuning (disk full, a lock held too long, a lost server)
  becomes one `StorageFailed` message naming the cause, not a chain of tracebacks;
- `assignment_lock`: tuners sharing a study take turns choosing their next trial, so no two of them
  pick the same pending trial.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import importlib.util
import logging
import os
import sqlite3
import time
import warnings
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from torchpace.files import (OutputWriteFailed, cannot_keep_own_files, check_not_a_link, describe_write_error, free_bytes,
                             open_lock, own_folder)
from torchpace.errors import TorchpaceError, UsageError
from torchpace.redact import redact, redact_url, remember_secrets

_log = logging.getLogger(__name__)

SQLITE_TIMEOUT_S = 60.0  # concurrent tuners on one SQLite file wait this long for its lock
_LOCK_POLL_S = 0.2  # a locked SQLite file is tried this often while a tune starts (each try answers at once)
_HEARTBEAT_INTERVAL_S = 2
# a trial whose tuner sent no heartbeat for this long is failed (then run again): longer than a live
# tuner's heartbeat may wait for the database's lock, so no live tuner's trial is failed; a tuner on
# the same host that died is found at once by its pid (`study.fail_stale_trials`)
_GRACE_PERIOD_S = int(SQLITE_TIMEOUT_S) + 2 * _HEARTBEAT_INTERVAL_S
SERVER_CONNECT_TIMEOUT_S = 10  # a database server that does not answer within this is unreachable
POSTGRES_DRIVERS = ("psycopg", "psycopg2")  # preferred first; `torchpace[postgres]` installs psycopg 3
_LOCK_CLASS = 0x7470  # pg_advisory_xact_lock(class, study_id): "tp", torchpace's assignment lock
STUDY_CORE_TABLES = frozenset({"studies", "trials", "version_info"})  # an Optuna storage has at least these
_EXAMPLE_URLS = "e.g. sqlite:///path/studies.db or postgresql://user:password@host:5432/database"


class StorageFailed(TorchpaceError):
    """The study's database failed while it was in use (disk full, lock held too long, server gone). Exit 1."""


def mask_url(url: str) -> str:
    """`url` with its secrets masked, for messages and reports (`torchpace.redact`: every form)."""
    return redact_url(url)


def sqlite_database(url: str) -> str | None:
    """The file of an SQLite URL (None for other databases and for in-memory SQLite)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    return parsed.database if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") else None


DEFAULT_STUDY_FILE = Path(".torchpace") / "studies.db"  # the default storage, relative to the working folder


def default_storage_url(workdir: Path | None = None) -> str:
    """`sqlite:///WORKDIR/.torchpace/studies.db` (the folder is created: a real one, and the file not a link,
    else UsageError naming it: `torchpace.files.own_folder`)."""
    path = own_folder(DEFAULT_STUDY_FILE.parent, root=workdir or Path.cwd()) / DEFAULT_STUDY_FILE.name
    check_not_a_link(path, "a file of its own (or give --storage)")
    return f"sqlite:///{path}"


def resolve_storage_url(url: str, installed: Callable[[str], bool] | None = None) -> str:
    """The URL SQLAlchemy opens: `postgresql://` and `postgres://` name the installed PostgreSQL driver.

    Args:
        url: the `--storage` URL as the user gave it.
        installed: module name -> whether it can be imported (injected by tests).

    Raises:
        UsageError: not a database URL, or PostgreSQL without a driver (names `pip install torchpace[postgres]`).
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    installed = installed or (lambda name: importlib.util.find_spec(name) is not None)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UsageError(f"--storage {url!r} is not a database URL; {_EXAMPLE_URLS}") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in ("postgresql", "postgres") or (driver and driver not in POSTGRES_DRIVERS):
        check_driver(url)  # another database, or another PostgreSQL driver named (pg8000, asyncpg)
        return url
    wanted = (driver,) if driver else POSTGRES_DRIVERS
    found = next((name for name in wanted if installed(name)), None)
    if found is None:
        other = next((name for name in POSTGRES_DRIVERS if name not in wanted and installed(name)), None)
        if other is not None:  # another driver is there: say so rather than "none is installed"
            raise UsageError(f"--storage {mask_url(url)} needs the PostgreSQL driver {driver}, which is not installed: "
                             f"pip install '{_DRIVER_PACKAGES.get(driver, driver)}', or name the installed one "
                             f"(postgresql+{other}://...)")
        raise UsageError(f"--storage {mask_url(url)} needs a PostgreSQL driver ({' or '.join(wanted)}), and none is "
                         "installed: pip install 'torchpace[postgres]'")
    return parsed.set(drivername=f"postgresql+{found}").render_as_string(hide_password=False)


_DRIVER_PACKAGES = {"MySQLdb": "mysqlclient", "psycopg2": "psycopg2-binary", "psycopg": "psycopg[binary]",
                    "cx_Oracle": "cx-Oracle", "pymssql": "pymssql", "pyodbc": "pyodbc", "pymysql": "PyMySQL",
                    "mysql": "mysql-connector-python", "oracledb": "oracledb"}  # module -> what pip installs


def check_driver(url: str) -> None:
    """UsageError (exit 2) when the database driver the URL names is unknown to SQLAlchemy, asynchronous
    (Optuna talks to its database synchronously), or not installed (`mysql://` without mysqlclient)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        dialect = make_url(url).get_dialect()
    except NoSuchModuleError:  # (an ArgumentError too)
        raise UsageError(f"--storage {mask_url(url)}: SQLAlchemy knows no database {make_url(url).drivername!r}; "
                         f"{_EXAMPLE_URLS}") from None
    except ArgumentError:
        raise UsageError(f"--storage {mask_url(url)} is not a database URL; {_EXAMPLE_URLS}") from None
    if getattr(dialect, "is_async", False):
        raise UsageError(f"--storage {mask_url(url)} names an asynchronous driver ({dialect.driver}), and Optuna "
                         "talks to its database synchronously: name a synchronous driver (e.g. mysql+pymysql://)")
    try:
        dialect.import_dbapi()
    except ImportError as err:
        module = getattr(err, "name", None) or dialect.driver
        package = _DRIVER_PACKAGES.get(module.split(".")[0], module)
        raise UsageError(f"--storage {mask_url(url)} needs the {dialect.name} driver {module!r}, which is not "
                         f"installed: pip install {package!r} (or name an installed driver: "
                         f"{dialect.name}+DRIVER://...)") from None


def connect_args(url: str) -> dict[str, Any]:
    """The DB-API connect arguments that bound every wait: SQLite's lock timeout, a server's connect timeout.

    A value given in the URL's query (`?timeout=5`, `?connect_timeout=3`) wins over the default.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return {} if "timeout" in parsed.query else {"timeout": SQLITE_TIMEOUT_S}
    if backend == "postgresql" and parsed.get_driver_name() in POSTGRES_DRIVERS:
        return {} if "connect_timeout" in parsed.query else {"connect_timeout": SERVER_CONNECT_TIMEOUT_S}
    return {}


def sqlite_timeout_s(url: str) -> float:
    """How long a connection to this SQLite URL waits for a lock, seconds."""
    from sqlalchemy.engine import make_url

    return float(make_url(url).query.get("timeout", SQLITE_TIMEOUT_S))


# ---- checks before anything is written ------------------------------------------------------------


def optuna_tables() -> frozenset[str]:
    """Every table Optuna's RDB storage creates (its schema, plus alembic's version table)."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    from optuna.storages._rdb import models

    return frozenset(models.BaseModel.metadata.tables) | {"alembic_version"}


def read_table_names(url: str) -> frozenset[str]:
    """The tables of the database `url` names, read without writing anything.

    Raises:
        UsageError: the database cannot be read or reached (an SQLite file that is missing or not
            SQLite; a server that refuses, times out, or has no such database), the URL's password masked.
    """
    database = sqlite_database(url)
    if database is not None:
        return _sqlite_tables(database, sqlite_timeout_s(url))
    import sqlalchemy
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    resolved = resolve_storage_url(url)
    engine = sqlalchemy.create_engine(resolved, connect_args=connect_args(resolved), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return frozenset(sqlalchemy.inspect(conn).get_table_names())
    except SQLAlchemyError as err:
        raise UsageError(describe_connect_error(url, err)) from None
    finally:
        engine.dispose()


def _sqlite_tables(path: str, timeout_s: float) -> frozenset[str]:
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True, timeout=timeout_s)) as conn:
            return frozenset(row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    except sqlite3.DatabaseError as err:
        if "locked" in str(err):
            raise StorageFailed(f"{path!r} stayed locked by another process for {timeout_s:g} s (database is locked); "
                                "try again when it is free, or wait longer with ?timeout=SECONDS in the URL") from None
        raise UsageError(f"{path!r} is not a usable Optuna database: not a readable SQLite database ({err})") from None


def read_schema_versions(url: str) -> tuple[str | None, str | None]:
    """(the revision of Optuna's table schema, the Optuna version that created the tables) of the database
    `url` names, read without writing anything; None for what it does not hold (a new, empty database).

    Raises:
        UsageError: as `read_table_names`: the database cannot be read or reached.
    """
    tables = read_table_names(url)
    queries = [f"SELECT {column} FROM {table}" if table in tables else None
               for table, column in (("alembic_version", "version_num"), ("version_info", "library_version"))]
    database = sqlite_database(url)
    if database is not None:
        try:
            with closing(sqlite3.connect(f"{Path(database).resolve().as_uri()}?mode=ro", uri=True,
                                         timeout=sqlite_timeout_s(url))) as conn:
                rows = [conn.execute(query).fetchone() if query else None for query in queries]
        except sqlite3.DatabaseError as err:
            raise UsageError(f"{database!r} is not a usable Optuna database: its schema version cannot be read ({err})") from None
    else:
        import sqlalchemy
        from sqlalchemy.exc import SQLAlchemyError
        from sqlalchemy.pool import NullPool

        resolved = resolve_storage_url(url)
        engine = sqlalchemy.create_engine(resolved, connect_args=connect_args(resolved), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                rows = [conn.execute(sqlalchemy.text(query)).first() if query else None for query in queries]
        except SQLAlchemyError as err:
            raise UsageError(describe_connect_error(url, err)) from None
        finally:
            engine.dispose()
    revision, made_by = (str(row[0]) if row and row[0] is not None else None for row in rows)
    return revision, made_by


@functools.lru_cache(maxsize=1)
def optuna_schema_revisions() -> tuple[str, ...]:
    """The revisions of Optuna's table schema this Optuna knows, newest first (read from its Alembic scripts;
    empty where they cannot be read: Optuna's own check on opening then refuses another schema)."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna.storages._rdb as rdb
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    try:
        scripts = ScriptDirectory(os.path.join(os.path.dirname(rdb.__file__), "alembic"))
        return tuple(revision.revision for revision in scripts.walk_revisions())
    except (CommandError, OSError):
        return ()


def check_schema(url: str) -> None:
    """UsageError (exit 2) when the database holds Optuna tables of another schema than this Optuna reads,
    naming both versions, before anything is written (Optuna itself would add its newer tables, then refuse).

    Tables an older Optuna made can be upgraded (`optuna storage upgrade`); tables a newer Optuna made need
    that Optuna. A new or empty database passes (its tables are created)."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    database = sqlite_database(url)
    known = optuna_schema_revisions()
    if (database is not None and not Path(database).exists()) or not known:
        return
    revision, made_by = read_schema_versions(url)
    if revision is None or revision == known[0]:
        return
    made = f"Optuna {made_by}" if made_by else "another Optuna"
    if revision in known:
        remedy = (f"upgrade its tables with `optuna storage upgrade --storage {mask_url(url)}` (copy the database first: "
                  f"{made} cannot read it after)")
    else:
        remedy = "install the Optuna that made them (pip install -U optuna), or give another --storage"
    raise UsageError(f"the study storage {mask_url(url)} holds studies in the table schema of {made} (revision {revision}), "
                     f"and this Optuna {optuna.__version__} reads revision {known[0]}: {remedy}; nothing was written")


def check_storage(url: str, on_wait: Callable[[str], None] | None = None) -> None:
    """Refuse, before anything is written, a storage that cannot be reached or that is another application's.

    A database holding any table that is not Optuna's is refused: torchpace never adds its tables
    to an application's database. A missing SQLite file is fine (it will be created).

    Args:
        url: the `--storage` URL.
        on_wait: told a line when an SQLite file is locked by another process and the check waits for it.

    Raises:
        UsageError: as `read_table_names`, or the database holds tables that are not Optuna's.
    """
    resolved = resolve_storage_url(url)
    database = sqlite_database(resolved)
    if database is not None:
        if not Path(database).exists():
            _log.info("the study storage %s does not exist yet: it will be created", mask_url(resolved))
            return
        say_if_locked(database, url, on_wait)
    foreign = sorted(read_table_names(resolved) - optuna_tables())
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise UsageError(f"--storage {mask_url(url)} holds tables that are not an Optuna study ({shown}): torchpace "
                         "keeps studies in a database of their own and wrote nothing to this one; give a new SQLite "
                         "file or an empty database")


def say_if_locked(path: str, url: str, on_wait: Callable[[str], None] | None) -> None:
    """When another process holds the SQLite file's write lock, tell `on_wait` and wait for it here, in
    short tries (up to the URL's lock timeout), so a stop signal meanwhile is handled at once: SQLite's
    own wait happens in C, where no signal handler runs until it gives up."""
    timeout_s = sqlite_timeout_s(url)
    deadline = time.monotonic() + timeout_s
    told = False
    while _sqlite_write_locked(path):
        if not told and on_wait is not None:
            on_wait(f"{mask_url(url)} is locked by another process: waiting up to {timeout_s:g} s for it")
        told = True
        if time.monotonic() >= deadline:
            raise StorageFailed(f"{path!r} stayed locked by another process for {timeout_s:g} s (database is locked); "
                                "try again when it is free, or wait longer with ?timeout=SECONDS in the URL")
        time.sleep(_LOCK_POLL_S)


def _sqlite_write_locked(path: str) -> bool:
    """True while another connection holds a write lock on the SQLite file (answered at once)."""
    try:
        with closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
    except sqlite3.DatabaseError as err:
        return "locked" in str(err)  # any other error (not a database, unreadable): the read that follows says so
    return False


# ---- opening -------------------------------------------------------------------------------------


def open_storage(url: str, read_only: bool = False):
    """An Optuna RDBStorage with heartbeats and bounded waits (callers run `check_storage` first).

    Args:
        url: the `--storage` URL (`postgresql://` names the installed driver).
        read_only: the caller only reads an existing study (a report): create no tables.

    Raises:
        UsageError: the URL is not a usable Optuna database (unreachable, refused, not Optuna's).
    """
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna
    import sqlalchemy.exc

    resolved = resolve_storage_url(url)
    _log.info("opening the study storage %s%s", mask_url(resolved), " to read" if read_only else "")
    check_schema(url)  # before Optuna adds a table to a database of another schema
    if not read_only:
        _make_sqlite_parent(resolved)
    try:
        with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna's words; we rely on them
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return _storage_class()(resolved, engine_kwargs={"connect_args": connect_args(resolved)},
                                    heartbeat_interval=_HEARTBEAT_INTERVAL_S, grace_period=_GRACE_PERIOD_S,
                                    skip_table_creation=read_only)
    except RuntimeError as err:  # Optuna's own refusal of another table schema, where `check_schema` could not tell
        if "table schema" not in str(err):
            raise
        raise UsageError(f"--storage {mask_url(url)}: {redact(str(err))}") from None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ValueError, ImportError) as err:
        full = _full_disk(resolved, err)
        if full is not None:
            raise full from None
        raise UsageError(f"--storage {mask_url(url)} is not a usable Optuna database: {root_cause_line(err, url)}") from None


def _full_disk(url: str, err: BaseException) -> OutputWriteFailed | None:
    """The full-disk error (exit 1, the space left) of an SQLite storage that could not be written for lack
    of space, else None: the disk's failure, not a storage that is unusable."""
    database = sqlite_database(url)
    if database is None or ("disk is full" not in str(err) and free_bytes(Path(database)) != 0):
        return None
    return OutputWriteFailed(Path(database), describe_write_error(Path(database), OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))


def _make_sqlite_parent(url: str) -> None:
    """Create the directory of an SQLite URL's file (the file SQLite creates itself)."""
    database = sqlite_database(url)
    if database:
        try:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise cannot_keep_own_files(Path(database).parent, err) from None


@functools.lru_cache(maxsize=None)
def _storage_class():
    """Optuna's RDBStorage whose heartbeat thread keeps a database failure for the main thread instead of
    printing a traceback (the main thread's next write meets the same failure and reports it once)."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna
    import sqlalchemy.exc

    class HeartbeatKeepingStorage(optuna.storages.RDBStorage):
        heartbeat_failure: BaseException | None = None

        def record_heartbeat(self, trial_id: int) -> None:
            try:
                super().record_heartbeat(trial_id)
            except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as err:
                self.heartbeat_failure = err

    return HeartbeatKeepingStorage


# ---- failures while in use ------------------------------------------------------------------------

_CONNECT_HINTS = (
    ("password authentication failed", "check the user name and password"),
    ("does not exist", "create the database first (see `docs/fleet.md`: createdb)"),
    ("timeout", "is the server running, and reachable from this host?"),
    ("connection refused", "is the server running and listening on that host and port?"),
    ("could not translate host name", "is the host name right?"),
)
_FAILURE_HINTS = (
    ("disk is full", "free space on the disk that holds the database"),
    ("no space left", "free space on the disk that holds the database"),
    ("database is locked", "another process held its lock longer than the lock timeout (`?timeout=SECONDS` in an "
                           "SQLite URL waits longer)"),
    ("disk i/o error", "the disk that holds the database failed a read or write"),
    ("read-only", "the database or its folder is read-only"),
    ("server closed the connection", "the database server went away"),
    ("terminating connection", "the database server went away"),
)


def root_cause_line(err: BaseException, url: str) -> str:
    """The innermost cause of a (chained) database error, on one line, with the URL's secrets masked
    (in any spelling a driver quotes them: `torchpace.redact`)."""
    from sqlalchemy.exc import DBAPIError

    while err.__cause__ is not None:
        err = err.__cause__
    if isinstance(err, DBAPIError) and err.orig is not None:
        err = err.orig
    text = "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
    remember_secrets(url)
    return redact(text)[:400]


def _hint(cause: str, hints: tuple[tuple[str, str], ...]) -> str:
    return next((f"; {hint}" for pattern, hint in hints if pattern in cause.lower()), "")


def describe_connect_error(url: str, err: BaseException) -> str:
    """`--storage URL: cannot connect (cause); hint`, the password masked."""
    cause = root_cause_line(err, url)
    return f"--storage {mask_url(url)}: cannot connect ({cause}){_hint(cause, _CONNECT_HINTS)}"


def describe_failure(url: str, err: BaseException) -> str:
    """One line for a database failure in the middle of a tune: the storage, the cause, what to do."""
    cause = root_cause_line(err, url)
    return (f"the study storage {mask_url(url)} failed: {cause}{_hint(cause, _FAILURE_HINTS)}. Finished trials are "
            "kept in the study: run again with --resume once it is fixed")


@contextmanager
def storage_failures(url: str) -> Iterator[None]:
    """Turn a database error inside the block into one `StorageFailed` naming its cause (no chained tracebacks)."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna
    import sqlalchemy.exc

    storage_errors = (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError)
    try:
        yield
    except storage_errors as err:
        raise StorageFailed(describe_failure(url, err)) from None
    except AssertionError as err:  # Optuna's `_run_trial` asserts when the storage failed to record a trial's end
        cause = _chained(err, storage_errors)
        if cause is None:
            raise
        raise StorageFailed(describe_failure(url, cause)) from None


def _chained(err: BaseException, types: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of `types` among those `err` was raised while handling (its context chain)."""
    seen = err.__context__
    while seen is not None and not isinstance(seen, types):
        seen = seen.__context__
    return seen


# ---- several tuners on one study ------------------------------------------------------------------


@contextmanager
def assignment_lock(storage, study_id: int) -> Iterator[None]:
    """One tuner at a time reads a study's records and pins its next trial, so no two pick the same one.
    `storage` is the RDBStorage `open_storage` returned (its `engine` is public), not the cache Optuna's
    `Study` wraps it in.

    PostgreSQL: a transaction-level advisory lock (released at commit, or by the server when the
    holder's connection dies). SQLite: an exclusive `flock` on `FILE.lock` beside the database
    (SQLite's own locks cannot span Optuna's separate connections). Other databases: no lock.
    """
    engine = getattr(storage, "engine", None)
    if engine is not None and engine.dialect.name == "postgresql":
        import sqlalchemy

        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:c, :s)"), {"c": _LOCK_CLASS, "s": study_id})
            yield
        return
    database = sqlite_database(str(engine.url)) if engine is not None else None
    if database is None:
        yield
        return
    with open_lock(f"{database}.lock") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def copy_study(name: str, from_url: str, to_url: str) -> None:
    """Copy study `name` with all its trials from one storage to another (e.g. a host's SQLite file into
    the PostgreSQL database a fleet shares); `tune --resume` then goes on from it there.

    Raises:
        UsageError: either storage is unusable, the source has no such study, or the target already has one.
    """
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    check_storage(from_url)
    check_storage(to_url)
    target = open_storage(to_url)
    if name in optuna.get_all_study_names(target):
        raise UsageError(f"{mask_url(to_url)} already has a study {name!r}: delete it there or copy to another database")
    with storage_failures(to_url):
        try:
            optuna.copy_study(from_study_name=name, from_storage=open_storage(from_url, read_only=True), to_storage=target)
        except KeyError:
            raise UsageError(f"{mask_url(from_url)} has no study {name!r}") from None
