#!/usr/bin/env python3
"""psycopg 3 against pgfence: the contract checked with a real driver.

Usage: py_compat.py [HOST PORT DB [USER]]   (or PGFENCE_HOST / PGFENCE_PORT / PGFENCE_DB / PGFENCE_USER)

The database must hold the seed's tables (leader_lease with a 'sweeper' row, sweep_state fenced by
fence "sweeper" with that lease, audit unfenced) and `pgfence init` must have run. Prints one
PASS/FAIL line per check and exits non-zero if any check failed.
"""

import os
import sys
import threading
import time
import traceback

try:
    import psycopg
    from psycopg import errors, sql
except ImportError as e:  # pragma: no cover - reported to the Rust test
    print(f"FAIL import psycopg: {e} (run `make setup`)")
    sys.exit(2)

ARGS = sys.argv[1:]
HOST = ARGS[0] if len(ARGS) > 0 else os.environ.get("PGFENCE_HOST", "127.0.0.1")
PORT = int(ARGS[1] if len(ARGS) > 1 else os.environ.get("PGFENCE_PORT", "6432"))
DB = ARGS[2] if len(ARGS) > 2 else os.environ.get("PGFENCE_DB", "postgres")
USER = ARGS[3] if len(ARGS) > 3 else os.environ.get("PGFENCE_USER", "postgres")
FENCE = "sweeper"

FAILED = []


def check(fn):
    """Runs one check; a raised exception or failed assert is a FAIL."""
    name = fn.__name__
    try:
        fn()
        print(f"PASS {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
        FAILED.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc(file=sys.stdout)
    return fn


def connect(epoch=None, autocommit=True, **kw):
    opts = {}
    if epoch is not None:
        opts["options"] = f"-c pgfence.epoch={epoch}"
    return psycopg.connect(
        host=HOST, port=PORT, dbname=DB, user=USER, sslmode="prefer", autocommit=autocommit,
        connect_timeout=10, **opts, **kw
    )


def takeover(holder):
    """The seed's acquire (expiring the lease first), through pgfence: leader_lease is not fenced."""
    with connect() as c:
        c.execute("UPDATE leader_lease SET expires_at = '-infinity' WHERE name = %s", (FENCE,))
        return c.execute(
            "UPDATE leader_lease SET holder = %s, epoch = epoch + 1, expires_at = now() + interval '30 s' "
            "WHERE name = %s AND (holder IS NULL OR holder = %s OR expires_at < now()) RETURNING epoch",
            (holder, FENCE, holder),
        ).fetchone()[0]


def note():
    with connect() as c:
        return c.execute("SELECT note FROM sweep_state WHERE id = 1").fetchone()[0]


def sqlstate_of(fn):
    try:
        fn()
    except psycopg.Error as e:
        return e.sqlstate, e
    return "ok", None


def expect_state(expected, fn):
    state, err = sqlstate_of(fn)
    assert state == expected, f"expected {expected}, got {state}: {err}"
    return err


def stale_message(declared, current):
    return f'pgfence: epoch {declared} is stale for fence "{FENCE}" (current epoch {current})'


E1 = takeover("py-a")


@check
def connect_with_sslmode_prefer_falls_back_to_plaintext():
    with connect() as c:
        assert c.execute("SELECT 40 + 2").fetchone()[0] == 42
        assert not c.pgconn.ssl_in_use


@check
def libpq_18_asking_for_protocol_3_2_is_negotiated_down():
    if psycopg.pq.version() < 180000:
        print(f"SKIP libpq {psycopg.pq.version()} cannot ask for protocol 3.2")
        return
    with connect(E1, max_protocol_version="latest") as c:
        assert c.pgconn.protocol_version == 3
        assert c.execute("SHOW pgfence.epoch").fetchone()[0] == str(E1)
        c.execute("UPDATE sweep_state SET note = 'protocol-3.2' WHERE id = 1")
        assert c.info.backend_pid == c.execute("SELECT pg_backend_pid()").fetchone()[0]
        threading.Thread(target=lambda: (time.sleep(0.3), c.cancel_safe())).start()
        expect_state("57014", lambda: c.execute("SELECT pg_sleep(20)"))


@check
def simple_query_protocol_multi_statement():
    with connect() as c:
        cur = psycopg.ClientCursor(c)
        cur.execute("SELECT 1 AS a; SELECT 'two' AS b")
        assert cur.fetchone() == (1,)
        assert cur.nextset()
        assert cur.fetchone() == ("two",)
        # The raw simple protocol, as libpq's PQexec sends it.
        res = c.pgconn.exec_(b"SELECT 7")
        assert res.get_value(0, 0) == b"7"


@check
def parameterised_queries_text_and_binary():
    with connect() as c:
        assert c.execute("SELECT %s::int + %s::int", (40, 2)).fetchone()[0] == 42
        cur = c.cursor(binary=True)
        row = cur.execute("SELECT %s::bigint, %s::text, %s::bytea", (2**62, "été", b"\x00\xff")).fetchone()
        assert row == (2**62, "été", b"\x00\xff"), row


@check
def fenced_write_with_current_epoch_succeeds_simple_and_extended():
    with connect(E1) as c:
        c.execute("UPDATE sweep_state SET note = %s WHERE id = 1", ("py-extended",))
        assert note() == "py-extended"
        psycopg.ClientCursor(c).execute("UPDATE sweep_state SET note = 'py-simple' WHERE id = 1")
        assert note() == "py-simple"


@check
def prepared_statement_reused_then_rejected_then_still_usable():
    global E1
    with connect(E1) as c:
        q = "UPDATE sweep_state SET note = %s WHERE id = 1"
        for i in range(5):
            c.execute(q, (f"prep-{i}",), prepare=True)
        names = c.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'UPDATE sweep_state%%'")
        assert names.fetchone()[0] >= 1, "psycopg did not prepare the statement"
        assert note() == "prep-4"
        old = E1
        E1 = takeover("py-b")
        err = expect_state("PF001", lambda: c.execute(q, ("stale",), prepare=True))
        assert err.diag.message_primary == stale_message(old, E1), err.diag.message_primary
        assert err.diag.message_hint, "PF001 without a HINT"
        assert note() == "prep-4"
        # The connection and the prepared statement stay usable.
        assert c.execute("SELECT 1").fetchone()[0] == 1
        c.execute("SET pgfence.epoch = %s" % E1)
        c.execute(q, ("prep-new",), prepare=True)
        assert note() == "prep-new"


@check
def prepare_threshold_zero_prepares_every_statement():
    with connect(E1) as c:
        c.prepare_threshold = 0
        for i in range(3):
            c.execute("UPDATE sweep_state SET note = %s WHERE id = 1", (f"thr-{i}",))
            c.execute("SELECT note FROM sweep_state WHERE id = %s", (1,)).fetchone()
        assert note() == "thr-2"


def _dup_in_tx(c):
    with c.transaction():
        c.execute("UPDATE sweep_state SET note = 'tx-dup' WHERE id = 1")
        c.execute("INSERT INTO sweep_state (id, note) VALUES (1, 'dup')")


@check
def transactions_commit_rollback_and_error_inside():
    with connect(E1, autocommit=False) as c:
        with c.transaction():
            c.execute("UPDATE sweep_state SET note = 'tx-commit' WHERE id = 1")
            c.execute("INSERT INTO audit (note) VALUES ('tx-commit')")
        assert note() == "tx-commit"

        class Boom(Exception):
            pass

        try:
            with c.transaction():
                c.execute("UPDATE sweep_state SET note = 'tx-rollback' WHERE id = 1")
                raise Boom()
        except Boom:
            pass
        assert note() == "tx-commit"
        # 23505 from Postgres inside a fenced transaction aborts it as usual.
        err = expect_state("23505", lambda: _dup_in_tx(c))
        assert isinstance(err, errors.UniqueViolation)
        assert note() == "tx-commit"
        assert c.execute("SELECT 1").fetchone()[0] == 1
        c.commit()



@check
def rejected_write_in_transaction_commits_nothing():
    stale = E1 - 1
    assert stale >= 1
    with connect(stale, autocommit=False) as c:
        c.execute("INSERT INTO audit (note) VALUES ('must-vanish')")
        err = expect_state("PF001", lambda: c.execute("UPDATE sweep_state SET note = 'stale' WHERE id = 1"))
        assert err.diag.message_primary == stale_message(stale, E1)
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        expect_state("25P02", lambda: c.execute("SELECT 1"))
        c.commit()  # COMMIT of an aborted transaction rolls back
        assert c.execute("SELECT count(*) FROM audit WHERE note = 'must-vanish'").fetchone()[0] == 0
        c.commit()
    assert note() != "stale"


@check
def error_sqlstates():
    with connect() as c:
        expect_state("42P01", lambda: c.execute("SELECT * FROM no_such_table"))
        c.execute("INSERT INTO audit (id, note) VALUES (-1, 'x')")
        err = expect_state("23505", lambda: c.execute("INSERT INTO audit (id, note) VALUES (-1, 'x')"))
        assert isinstance(err, errors.UniqueViolation)
        err = expect_state("PF002", lambda: c.execute("UPDATE sweep_state SET note = 'none' WHERE id = 1"))
        assert FENCE in err.diag.message_primary and err.diag.message_hint, err.diag
        err = expect_state("PF003", lambda: c.execute("SET pgfence.epoch = 0"))
        assert err.diag.message_hint
        expect_state("PF003", lambda: c.execute("SET pgfence.epoch = 'abc'"))
        expect_state("PF003", lambda: c.execute("SET pgfence.epoch = 9223372036854775808"))
        # Above what the lease granted.
        c.execute(f"SET pgfence.epoch = {E1 + 5}")
        expect_state("PF003", lambda: c.execute("UPDATE sweep_state SET note = 'future' WHERE id = 1"))
        assert c.execute("SELECT 1").fetchone()[0] == 1
    assert note() not in ("none", "future")


@check
def invalid_startup_epoch_fails_the_connection_with_pf003():
    for bad in ["0", "-3", "abc", "9223372036854775808"]:
        try:
            connect(bad).close()
        except psycopg.OperationalError as e:
            text = str(e)
            assert "pgfence.epoch" in text and "invalid" in text, text
            # libpq has no result for a failed connection, but keeps the fields of the FATAL.
            state = getattr(e, "sqlstate", None)
            assert state in (None, "PF003"), state
        else:
            raise AssertionError(f"epoch {bad!r} was accepted at startup")


@check
def set_local_reset_and_show_follow_postgres():
    with connect(E1) as c:
        assert c.execute("SHOW pgfence.epoch").fetchone()[0] == str(E1)
        c.execute("SET pgfence.epoch = 1")
        assert c.execute("SHOW pgfence.epoch").fetchone()[0] == "1"
        expect_state("PF001", lambda: c.execute("UPDATE sweep_state SET note = 'x' WHERE id = 1"))
        c.execute("RESET pgfence.epoch")
        assert c.execute("SHOW pgfence.epoch").fetchone()[0] == str(E1)
        c.execute("UPDATE sweep_state SET note = 'after-reset' WHERE id = 1")
        # SET LOCAL ends with the transaction.
        with c.transaction():
            c.execute("SET LOCAL pgfence.epoch = 1")
            assert c.execute("SELECT current_setting('pgfence.epoch')").fetchone()[0] == "1"
            expect_state("PF001", lambda: c.execute("UPDATE sweep_state SET note = 'x' WHERE id = 1"))
            raise psycopg.Rollback()
        assert c.execute("SHOW pgfence.epoch").fetchone()[0] == str(E1)
        # A session SET in a rolled-back transaction is undone.
        with c.transaction():
            c.execute("SET pgfence.epoch = 1")
            raise psycopg.Rollback()
        assert c.execute("SHOW pgfence.epoch").fetchone()[0] == str(E1)
        c.execute("UPDATE sweep_state SET note = 'after-rollback' WHERE id = 1")
        # An invalid SET keeps the previous value.
        expect_state("PF003", lambda: c.execute("SET pgfence.epoch = -1"))
        assert c.execute("SHOW pgfence.epoch").fetchone()[0] == str(E1)
        c.execute("UPDATE sweep_state SET note = 'after-invalid' WHERE id = 1")
        # SET with a bound parameter is not possible in Postgres; set_config() is not a declaration.
        c.execute("SELECT set_config('pgfence.epoch', '1', false)")
        c.execute("UPDATE sweep_state SET note = 'after-set-config' WHERE id = 1")
        c.execute(sql.SQL("SET pgfence.epoch TO {}").format(sql.Literal(str(E1))))
    assert note() == "after-set-config"
    with connect() as c:
        expect_state("PF002", lambda: c.execute("DELETE FROM sweep_state WHERE id = 999"))
        c.execute(f"SET SESSION pgfence.epoch TO {E1}")
        c.execute("DELETE FROM sweep_state WHERE id = 999")
        c.execute("SET pgfence.epoch = DEFAULT")
        expect_state("PF002", lambda: c.execute("DELETE FROM sweep_state WHERE id = 999"))


@check
def copy_in_and_out():
    with connect(E1) as c:
        cur = c.cursor()
        with cur.copy("COPY audit (note) FROM STDIN") as cp:
            for i in range(100):
                cp.write_row((f"copy-{i}",))
        assert c.execute("SELECT count(*) FROM audit WHERE note LIKE 'copy-%%'").fetchone()[0] == 100
        with cur.copy("COPY sweep_state (id, note) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(["int4", "text"])
            for i in range(1000, 1050):
                cp.write_row((i, "fenced-copy"))
        rows = []
        with cur.copy("COPY (SELECT id, note FROM sweep_state WHERE note = 'fenced-copy' ORDER BY id) TO STDOUT") as cp:
            for row in cp.rows():
                rows.append(row)
        assert len(rows) == 50 and rows[0] == ("1000", "fenced-copy"), rows[:2]
    # Without an epoch, COPY FROM into a fenced table is refused and nothing lands.
    with connect() as c:
        def copy_in():
            with c.cursor().copy("COPY sweep_state (id, note) FROM STDIN") as cp:
                cp.write_row((2000, "no-epoch"))
        expect_state("PF002", copy_in)
        assert c.execute("SELECT count(*) FROM sweep_state WHERE id = 2000").fetchone()[0] == 0
    with connect(E1 - 1) as c:
        def copy_stale():
            with c.cursor().copy("COPY sweep_state (id, note) FROM STDIN") as cp:
                cp.write_row((2001, "stale"))
        expect_state("PF001", copy_stale)
        assert c.execute("SELECT count(*) FROM sweep_state WHERE id = 2001").fetchone()[0] == 0


@check
def listen_notify():
    with connect() as listener, connect() as sender:
        listener.execute("LISTEN pgfence_ch")
        sender.execute("NOTIFY pgfence_ch, 'hello'")
        got = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in got] == ["hello"], got
        sender.execute("SELECT pg_notify('pgfence_ch', 'two')")
        got = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in got] == ["two"], got


@check
def backend_pid_matches_the_server_and_own_notifies():
    with connect() as c:
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert c.info.backend_pid == pid, (c.info.backend_pid, pid)
        c.execute("LISTEN pgfence_self")
        c.execute("NOTIFY pgfence_self, 'me'")
        got = list(c.notifies(timeout=5, stop_after=1))
        assert [(n.pid, n.payload) for n in got] == [(pid, "me")], got


@check
def cancel_of_pg_sleep():
    for method in ("cancel", "cancel_safe"):
        with connect() as c:
            def later():
                time.sleep(0.5)
                getattr(c, method)()
            t = threading.Thread(target=later)
            start = time.monotonic()
            t.start()
            expect_state("57014", lambda: c.execute("SELECT pg_sleep(20)"))
            t.join()
            assert time.monotonic() - start < 10, f"{method} took too long"
            assert c.execute("SELECT 1").fetchone()[0] == 1


@check
def pipeline_of_fenced_writes():
    with connect(E1, autocommit=False) as c:
        with c.pipeline():
            for i in range(5):
                c.execute("UPDATE sweep_state SET note = %s WHERE id = 1", (f"pipe-{i}",))
            c.execute("INSERT INTO audit (note) VALUES ('pipe-ok')")
            c.commit()
        assert note() == "pipe-4"
    with connect(E1, autocommit=True) as c:
        with c.pipeline():
            for i in range(5):
                c.execute("UPDATE sweep_state SET note = %s WHERE id = 1", (f"pipe-ac-{i}",))
        assert note() == "pipe-ac-4"


@check
def stale_pipeline_fails_like_postgres_and_connection_stays_usable():
    with connect(E1 - 1, autocommit=False) as c:
        def stale_batch():
            with c.pipeline():
                c.execute("INSERT INTO audit (note) VALUES ('pipe-stale')")
                for i in range(3):
                    c.execute("UPDATE sweep_state SET note = %s WHERE id = 1", (f"stale-{i}",))
                c.execute("SELECT 1")
                c.commit()
        err = expect_state("PF001", stale_batch)
        assert err.diag.message_primary == stale_message(E1 - 1, E1)
        c.rollback()
        assert c.execute("SELECT count(*) FROM audit WHERE note = 'pipe-stale'").fetchone()[0] == 0
        c.rollback()
        # Still usable, also for a pipeline with the current epoch.
        c.execute(f"SET pgfence.epoch = {E1}")
        with c.pipeline():
            c.execute("UPDATE sweep_state SET note = 'pipe-after' WHERE id = 1")
            c.execute("INSERT INTO audit (note) VALUES ('pipe-after')")
        c.commit()
    assert note() == "pipe-after"
    with connect(E1 - 1, autocommit=True) as c:
        def stale_ac():
            with c.pipeline():
                c.execute("UPDATE sweep_state SET note = 'stale-ac' WHERE id = 1")
                c.execute("SELECT 2")
        expect_state("PF001", stale_ac)
        assert c.execute("SELECT 3").fetchone()[0] == 3
    assert note() == "pipe-after"


@check
def executemany_fenced_insert():
    with connect(E1) as c:
        c.cursor().executemany(
            "INSERT INTO sweep_state (id, note) VALUES (%s, %s)", [(3000 + i, "many") for i in range(20)]
        )
        assert c.execute("SELECT count(*) FROM sweep_state WHERE note = 'many'").fetchone()[0] == 20
    with connect(E1 - 1) as c:
        expect_state(
            "PF001",
            lambda: c.cursor().executemany(
                "INSERT INTO sweep_state (id, note) VALUES (%s, %s)", [(4000 + i, "many-stale") for i in range(5)]
            ),
        )
        assert c.execute("SELECT count(*) FROM sweep_state WHERE note = 'many-stale'").fetchone()[0] == 0


if FAILED:
    print(f"psycopg: {len(FAILED)} check(s) failed: {', '.join(FAILED)}")
    sys.exit(1)
print("psycopg: all checks passed")
