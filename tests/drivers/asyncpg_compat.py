#!/usr/bin/env python3
"""asyncpg against pgfence: the strictest driver about protocol details (extended protocol only,
Describe before every new statement, named statements in a cache, binary formats, pipelined Syncs).

Usage: asyncpg_compat.py [HOST PORT DB [USER]]   (or PGFENCE_HOST / PGFENCE_PORT / PGFENCE_DB / PGFENCE_USER)

Expects the seed's tables and `pgfence init` (see py_compat.py). Prints one PASS/FAIL line per check
and exits non-zero if any check failed.
"""

import asyncio
import os
import sys
import traceback

try:
    import asyncpg
except ImportError as e:  # pragma: no cover - reported to the Rust test
    print(f"FAIL import asyncpg: {e} (run `make setup`)")
    sys.exit(2)

ARGS = sys.argv[1:]
HOST = ARGS[0] if len(ARGS) > 0 else os.environ.get("PGFENCE_HOST", "127.0.0.1")
PORT = int(ARGS[1] if len(ARGS) > 1 else os.environ.get("PGFENCE_PORT", "6432"))
DB = ARGS[2] if len(ARGS) > 2 else os.environ.get("PGFENCE_DB", "postgres")
USER = ARGS[3] if len(ARGS) > 3 else os.environ.get("PGFENCE_USER", "postgres")
FENCE = "sweeper"

FAILED = []
CHECKS = []
E1 = 0


def check(fn):
    CHECKS.append(fn)
    return fn


async def run_checks():
    for fn in CHECKS:
        try:
            await asyncio.wait_for(fn(), 60)
            print(f"PASS {fn.__name__}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
            FAILED.append(fn.__name__)
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(file=sys.stdout)


async def connect(epoch=None, **kw):
    settings = {}
    if epoch is not None:
        settings["pgfence.epoch"] = str(epoch)
    # ssl defaults to 'prefer' in asyncpg: it sends SSLRequest and falls back to plaintext on 'N'.
    return await asyncpg.connect(
        host=HOST, port=PORT, database=DB, user=USER, server_settings=settings, timeout=10, **kw
    )


async def takeover(holder):
    c = await connect()
    try:
        await c.execute("UPDATE leader_lease SET expires_at = '-infinity' WHERE name = $1", FENCE)
        return await c.fetchval(
            "UPDATE leader_lease SET holder = $1, epoch = epoch + 1, expires_at = now() + interval '30 s' "
            "WHERE name = $2 AND (holder IS NULL OR holder = $1 OR expires_at < now()) RETURNING epoch",
            holder,
            FENCE,
        )
    finally:
        await c.close()


async def note():
    c = await connect()
    try:
        return await c.fetchval("SELECT note FROM sweep_state WHERE id = 1")
    finally:
        await c.close()


async def expect_state(expected, coro):
    try:
        await coro
    except asyncpg.PostgresError as e:
        assert e.sqlstate == expected, f"expected {expected}, got {e.sqlstate}: {e}"
        return e
    raise AssertionError(f"expected {expected}, got success")


def stale_message(declared, current):
    return f'pgfence: epoch {declared} is stale for fence "{FENCE}" (current epoch {current})'


@check
async def connect_with_default_ssl_prefer_and_simple_query():
    c = await connect()
    try:
        assert await c.fetchval("SELECT 40 + 2") == 42
        # execute() without arguments uses the simple protocol.
        await c.execute("SELECT 1; SELECT 2; CREATE TEMP TABLE t (x int); DROP TABLE t")
    finally:
        await c.close()


@check
async def parameterised_queries_with_binary_codecs():
    c = await connect()
    try:
        import datetime
        import decimal

        now = datetime.datetime.now(datetime.timezone.utc)
        row = await c.fetchrow(
            "SELECT $1::bigint AS a, $2::text AS b, $3::bytea AS c, $4::numeric AS d, $5::timestamptz AS e, "
            "$6::int[] AS f, $7::jsonb AS g",
            2**62, "été", b"\x00\xff", decimal.Decimal("1.5"), now, [1, 2, 3], '{"k": 1}',
        )
        assert tuple(row) == (2**62, "été", b"\x00\xff", decimal.Decimal("1.5"), now, [1, 2, 3], '{"k": 1}'), row
    finally:
        await c.close()


@check
async def fenced_writes_through_the_statement_cache():
    c = await connect(E1)
    try:
        q = "UPDATE sweep_state SET note = $1, last_epoch = $2 WHERE id = 1"
        for i in range(6):
            status = await c.execute(q, f"cache-{i}", E1)
            assert status == "UPDATE 1", status
        assert await note() == "cache-5"
        # RETURNING goes through fetch (Describe + DataRow in binary).
        rows = await c.fetch("UPDATE sweep_state SET note = $1 WHERE id = 1 RETURNING id, note", "returning")
        assert [tuple(r) for r in rows] == [(1, "returning")], rows
        stmts = await c.fetchval("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'UPDATE sweep_state%'")
        assert stmts >= 1, "asyncpg did not cache the statement"
    finally:
        await c.close()


@check
async def stale_epoch_is_pf001_with_message_and_hint_and_connection_survives():
    global E1
    c = await connect(E1)
    try:
        q = "UPDATE sweep_state SET note = $1 WHERE id = 1"
        await c.execute(q, "before-takeover")
        old, E1 = E1, await takeover("asyncpg-b")
        e = await expect_state("PF001", c.execute(q, "stale"))
        assert e.args[0] == stale_message(old, E1) or str(e) == stale_message(old, E1), str(e)
        assert e.hint, "PF001 without a HINT"
        e = await expect_state("PF001", c.fetch("UPDATE sweep_state SET note = $1 WHERE id = 1 RETURNING id", "stale"))
        e = await expect_state("PF001", c.fetchval("DELETE FROM sweep_state WHERE id = $1 RETURNING id", 1))
        # The simple protocol too.
        await expect_state("PF001", c.execute("UPDATE sweep_state SET note = 'stale' WHERE id = 1"))
        assert await c.fetchval("SELECT 1") == 1
        assert await note() == "before-takeover"
        # Same cached statement, new epoch: works.
        await c.execute(f"SET pgfence.epoch = {E1}")
        await c.execute(q, "after-takeover")
        assert await note() == "after-takeover"
    finally:
        await c.close()


@check
async def explicit_prepared_statement_reused():
    c = await connect(E1)
    try:
        stmt = await c.prepare("UPDATE sweep_state SET note = $1 WHERE id = $2 RETURNING note")
        for i in range(4):
            assert await stmt.fetchval(f"prep-{i}", 1) == f"prep-{i}"
        await c.execute("SET pgfence.epoch = 1")
        await expect_state("PF001", stmt.fetchval("x", 1))
        await c.execute("RESET pgfence.epoch")
        assert await stmt.fetchval("prep-again", 1) == "prep-again"
        sel = await c.prepare("SELECT note FROM sweep_state WHERE id = $1")
        assert await sel.fetchval(1) == "prep-again"
    finally:
        await c.close()


@check
async def executemany_pipelines_fenced_writes():
    c = await connect(E1)
    try:
        await c.executemany(
            "INSERT INTO sweep_state (id, note) VALUES ($1, $2)", [(100 + i, "many") for i in range(50)]
        )
        assert await c.fetchval("SELECT count(*) FROM sweep_state WHERE note = 'many'") == 50
        await c.executemany("UPDATE sweep_state SET note = $2 WHERE id = $1", [(100 + i, "many2") for i in range(50)])
        assert await c.fetchval("SELECT count(*) FROM sweep_state WHERE note = 'many2'") == 50
    finally:
        await c.close()
    c = await connect(E1 - 1)
    try:
        await expect_state(
            "PF001",
            c.executemany("INSERT INTO sweep_state (id, note) VALUES ($1, $2)", [(200 + i, "stale") for i in range(20)]),
        )
        assert await c.fetchval("SELECT count(*) FROM sweep_state WHERE note = 'stale'") == 0
        await expect_state(
            "PF001", c.executemany("UPDATE sweep_state SET note = $2 WHERE id = $1", [(100, "x"), (101, "y")])
        )
        assert await c.fetchval("SELECT 5") == 5
        # In a transaction: the whole transaction is aborted.
        async def in_tx():
            async with c.transaction():
                await c.execute("INSERT INTO audit (note) VALUES ('many-tx')")
                await c.executemany("UPDATE sweep_state SET note = $2 WHERE id = $1", [(100, "x")])

        await expect_state("PF001", in_tx())
        assert await c.fetchval("SELECT count(*) FROM audit WHERE note = 'many-tx'") == 0
    finally:
        await c.close()


@check
async def transactions_commit_rollback_and_error_inside():
    c = await connect(E1)
    try:
        async with c.transaction():
            await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "tx-commit")
        assert await note() == "tx-commit"
        tr = c.transaction()
        await tr.start()
        await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "tx-rollback")
        await tr.rollback()
        assert await note() == "tx-commit"

        async def dup():
            async with c.transaction():
                await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "tx-dup")
                await c.execute("INSERT INTO sweep_state (id, note) VALUES (1, 'dup')")

        e = await expect_state("23505", dup())
        assert isinstance(e, asyncpg.UniqueViolationError)
        assert await note() == "tx-commit"
        # Savepoints (nested transactions) around a fenced write.
        async with c.transaction():
            await c.execute("INSERT INTO audit (note) VALUES ('outer')")
            try:
                async with c.transaction():
                    await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "inner")
                    raise RuntimeError("undo inner")
            except RuntimeError:
                pass
            await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "outer")
        assert await note() == "outer"
    finally:
        await c.close()


@check
async def rejection_inside_transaction_commits_nothing():
    c = await connect(E1 - 1)
    try:
        tr = c.transaction()
        await tr.start()
        await c.execute("INSERT INTO audit (note) VALUES ('asyncpg-vanish')")
        await expect_state("PF001", c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "stale"))
        await expect_state("25P02", c.fetchval("SELECT 1"))
        await tr.rollback()
        assert await c.fetchval("SELECT count(*) FROM audit WHERE note = 'asyncpg-vanish'") == 0
    finally:
        await c.close()


@check
async def error_sqlstates():
    c = await connect()
    try:
        e = await expect_state("42P01", c.fetch("SELECT * FROM no_such_table"))
        assert isinstance(e, asyncpg.UndefinedTableError)
        await c.execute("INSERT INTO audit (id, note) VALUES (-1, 'x')")
        e = await expect_state("23505", c.execute("INSERT INTO audit (id, note) VALUES ($1, 'x')", -1))
        assert isinstance(e, asyncpg.UniqueViolationError)
        e = await expect_state("PF002", c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "none"))
        assert FENCE in str(e) and e.hint, (str(e), e.hint)
        await expect_state("PF002", c.execute("UPDATE sweep_state SET note = 'none' WHERE id = 1"))
        e = await expect_state("PF003", c.execute("SET pgfence.epoch = 0"))
        assert e.hint
        await c.execute(f"SET pgfence.epoch = {E1 + 10}")
        await expect_state("PF003", c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "future"))
        assert await c.fetchval("SELECT 1") == 1
    finally:
        await c.close()
    assert await note() not in ("none", "future")


@check
async def invalid_server_settings_epoch_fails_connection_with_pf003():
    for bad in ["0", "abc", "", "9223372036854775808"]:
        try:
            c = await connect(bad)
        except asyncpg.PostgresError as e:
            assert e.sqlstate == "PF003", (bad, e.sqlstate, e)
            assert "pgfence.epoch" in str(e)
        else:
            await c.close()
            raise AssertionError(f"epoch {bad!r} was accepted at startup")


@check
async def server_settings_epoch_shows_and_set_local_reset_behave():
    c = await connect(E1)
    try:
        assert await c.fetchval("SHOW pgfence.epoch") == str(E1)
        assert await c.fetchval("SELECT current_setting('pgfence.epoch')") == str(E1)
        await c.execute("SET pgfence.epoch = 1")
        assert await c.fetchval("SHOW pgfence.epoch") == "1"
        await expect_state("PF001", c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "x"))
        await c.execute("RESET pgfence.epoch")
        assert await c.fetchval("SHOW pgfence.epoch") == str(E1)
        await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "after-reset")
        async with c.transaction():
            await c.execute("SET LOCAL pgfence.epoch = 1")
            await expect_state("PF001", c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "x"))
        assert await c.fetchval("SHOW pgfence.epoch") == str(E1)
        tr = c.transaction()
        await tr.start()
        await c.execute("SET pgfence.epoch = 1")
        await tr.rollback()
        assert await c.fetchval("SHOW pgfence.epoch") == str(E1)
        await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "after-rollback")
        # SET through the extended protocol (a prepared SET), as some ORMs send it.
        await c.fetch("SET pgfence.epoch = 1")
        await expect_state("PF001", c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "x"))
        await c.fetch(f"SET pgfence.epoch = {E1}")
        await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "after-extended-set")
        # What the pool does on release: RESET ALL returns to the startup value.
        await c.execute("SET pgfence.epoch = 1")
        await c.reset()
        assert await c.fetchval("SHOW pgfence.epoch") == str(E1)
        await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "after-conn-reset")
    finally:
        await c.close()
    assert await note() == "after-conn-reset"


@check
async def pool_with_server_settings_epoch():
    pool = await asyncpg.create_pool(
        host=HOST, port=PORT, database=DB, user=USER, server_settings={"pgfence.epoch": str(E1)},
        min_size=2, max_size=4,
    )
    try:
        async def work(i):
            async with pool.acquire() as c:
                await c.execute("INSERT INTO sweep_state (id, note) VALUES ($1, 'pool')", 500 + i)

        await asyncio.gather(*(work(i) for i in range(20)))
        assert await pool.fetchval("SELECT count(*) FROM sweep_state WHERE note = 'pool'") == 20
    finally:
        await pool.close()


@check
async def copy_in_and_out():
    c = await connect(E1)
    try:
        await c.copy_records_to_table("sweep_state", records=[(600 + i, "copied", 0) for i in range(100)])
        assert await c.fetchval("SELECT count(*) FROM sweep_state WHERE note = 'copied'") == 100
        await c.copy_records_to_table("audit", records=[("copied-audit",)] * 10, columns=["note"])
        import io

        out = io.BytesIO()
        await c.copy_from_query("SELECT id, note FROM sweep_state WHERE note = 'copied' ORDER BY id", output=out)
        lines = out.getvalue().decode().splitlines()
        assert len(lines) == 100 and lines[0] == "600\tcopied", lines[:2]
        out2 = io.BytesIO()
        await c.copy_from_table("audit", output=out2, columns=["note"])
        assert out2.getvalue().count(b"copied-audit") == 10
        await c.copy_to_table("sweep_state", source=io.BytesIO(b"700\tfrom-file\t0\n"))
        assert await c.fetchval("SELECT note FROM sweep_state WHERE id = 700") == "from-file"
    finally:
        await c.close()
    c = await connect(E1 - 1)
    try:
        await expect_state("PF001", c.copy_records_to_table("sweep_state", records=[(800, "stale", 0)]))
        assert await c.fetchval("SELECT count(*) FROM sweep_state WHERE id = 800") == 0
        assert await c.fetchval("SELECT 1") == 1
    finally:
        await c.close()
    c = await connect()
    try:
        await expect_state("PF002", c.copy_records_to_table("sweep_state", records=[(801, "none", 0)]))
        assert await c.fetchval("SELECT count(*) FROM sweep_state WHERE id = 801") == 0
    finally:
        await c.close()


@check
async def listen_notify():
    listener = await connect()
    sender = await connect()
    try:
        got = asyncio.get_running_loop().create_future()
        await listener.add_listener("pgfence_ch", lambda *a: got.done() or got.set_result(a[3]))
        await sender.execute("NOTIFY pgfence_ch, 'hello'")
        assert await asyncio.wait_for(got, 5) == "hello"
    finally:
        await listener.close()
        await sender.close()


@check
async def server_pid_matches_and_own_notifies_are_recognised():
    c = await connect()
    try:
        pid = await c.fetchval("SELECT pg_backend_pid()")
        assert c.get_server_pid() == pid, (c.get_server_pid(), pid)
        got = asyncio.get_running_loop().create_future()
        await c.add_listener("pgfence_self", lambda _c, p, _ch, payload: got.done() or got.set_result((p, payload)))
        await c.execute("NOTIFY pgfence_self, 'me'")
        assert await asyncio.wait_for(got, 5) == (pid, "me")
    finally:
        await c.close()


@check
async def timeout_cancels_pg_sleep():
    c = await connect()
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            await c.execute("SELECT pg_sleep(20)", timeout=0.5)
        except asyncio.TimeoutError:
            pass
        else:
            raise AssertionError("pg_sleep was not interrupted")
        assert await c.fetchval("SELECT 1", timeout=5) == 1
        assert loop.time() - start < 10
        # And a fenced write after a cancel still gets its guard.
        await c.execute(f"SET pgfence.epoch = {E1}")
        await c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", "after-cancel")
    finally:
        await c.close()


@check
async def stale_rejection_leaves_statement_cache_and_connection_usable():
    """Many rounds of reject/accept on the same cached statements, mixing fetch and execute."""
    c = await connect(E1)
    try:
        for i in range(10):
            stale = i % 2 == 0
            await c.execute(f"SET pgfence.epoch = {1 if stale else E1}")
            upd = c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", f"round-{i}")
            ret = c.fetchval("UPDATE sweep_state SET note = $1 WHERE id = 1 RETURNING note", f"round-{i}")
            if stale:
                await expect_state("PF001", upd)
                await expect_state("PF001", ret)
            else:
                await upd
                assert await ret == f"round-{i}"
            assert await c.fetchval("SELECT $1::int", i) == i
    finally:
        await c.close()


async def main():
    global E1
    await takeover("asyncpg-0")
    E1 = await takeover("asyncpg-a")
    await run_checks()


asyncio.run(main())
if FAILED:
    print(f"asyncpg: {len(FAILED)} check(s) failed: {', '.join(FAILED)}")
    sys.exit(1)
print("asyncpg: all checks passed")
