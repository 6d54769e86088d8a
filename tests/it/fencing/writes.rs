//! The write-path matrix: every statement form that may change a fenced
//! table, in the simple and the extended protocol, inside and outside BEGIN,
//! pipelined: a stale epoch changes nothing (PF001), the current one writes.

use futures_util::future::join_all;
use tokio_postgres::Client;

use super::{Fixture, code};
use crate::common::pg::Cluster;
use crate::common::raw::codes;

/// Statement forms that write `sweep_state` (each leaves the table in place).
const FORMS: &[&str] = &[
    "INSERT INTO sweep_state VALUES (10, 'ins', 0)",
    "insert into public.sweep_state (id, note) values (11, 'a'), (12, 'b')",
    "INSERT INTO \"sweep_state\" SELECT 13, 'sel', 0",
    "UPDATE sweep_state SET note = 'upd' WHERE id = 1",
    "UPDATE Sweep_State s SET note = a.note FROM audit a WHERE s.id = a.id",
    "DELETE FROM sweep_state WHERE id = 1",
    "DELETE FROM sweep_state s USING audit a WHERE s.id = a.id",
    "INSERT INTO sweep_state VALUES (1, 'ups', 0) ON CONFLICT (id) DO UPDATE SET note = excluded.note",
    "INSERT INTO sweep_state VALUES (1, 'x', 0) ON CONFLICT DO NOTHING",
    "MERGE INTO sweep_state t USING (SELECT 1 AS id) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET note = 'merge'",
    "WITH d AS (DELETE FROM sweep_state WHERE id = 1 RETURNING *) SELECT count(*) FROM d",
    "WITH u AS (UPDATE sweep_state SET note = 'cte' RETURNING id) INSERT INTO audit (note) SELECT 'x' FROM u",
    "EXPLAIN ANALYZE UPDATE sweep_state SET note = 'explain' WHERE id = 1",
    "EXPLAIN (ANALYZE, COSTS OFF) DELETE FROM sweep_state",
    "TRUNCATE sweep_state",
    "TRUNCATE audit, sweep_state",
    "ALTER TABLE sweep_state ADD COLUMN extra int",
    "ALTER TABLE sweep_state RENAME TO sweep_state2",
    "COPY (UPDATE sweep_state SET note = 'c' RETURNING id) TO STDOUT",
    "UPDATE /* comment */ sweep_state SET note = 'it''s; tricky' WHERE id = 1",
    // (Escaped without backslashes: the tests send them before the answer to a refusal is
    // in, and a backslash would then be refused for that reason.)
    "UPDATE U&\"sweep*005fstate\" UESCAPE '*' SET note = 'unicode' WHERE id = 1",
    "DELETE FROM public.u&\"sweep!005fstate\" UESCAPE '!' WHERE id = 1",
];

/// A digest of everything a write could change.
async fn digest(admin: &Client) -> String {
    let row = admin
        .query_one(
            "SELECT coalesce((SELECT string_agg(t::text, ',' ORDER BY id) FROM sweep_state t), '-')
                 || '|' || (SELECT count(*) FROM pg_attribute WHERE attrelid = 'sweep_state'::regclass AND attnum > 0)",
            &[],
        )
        .await;
    match row {
        Ok(r) => r.get(0),
        Err(e) => format!("gone: {e}"),
    }
}

async fn stale_and_current() -> (Fixture, Client, Client) {
    let f = Fixture::new().await;
    f.admin
        .batch_execute("INSERT INTO audit (id, note) VALUES (1, 'audit'); SELECT setval('audit_id_seq', 1)")
        .await
        .unwrap();
    f.takeover("a").await;
    f.takeover("b").await;
    let stale = f.leader(1).await;
    let current = f.leader(2).await;
    (f, stale, current)
}

#[tokio::test]
async fn stale_epoch_changes_nothing_in_any_form_simple_and_extended() {
    let (f, stale, _) = stale_and_current().await;
    let before = digest(&f.admin).await;
    for sql in FORMS {
        assert_eq!(code(&stale.batch_execute(sql).await), "PF001", "simple: {sql}");
        assert_eq!(code(&stale.execute(*sql, &[]).await), "PF001", "extended: {sql}");
        assert_eq!(
            code(&stale.batch_execute(&format!("BEGIN; {sql}; COMMIT")).await),
            "PF001",
            "in BEGIN: {sql}"
        );
        stale.batch_execute("ROLLBACK").await.unwrap();
        stale.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            code(&stale.execute(*sql, &[]).await),
            "PF001",
            "extended in BEGIN: {sql}"
        );
        assert_eq!(code(&stale.batch_execute("COMMIT").await), "ok");
    }
    stale
        .batch_execute("PREPARE p AS UPDATE sweep_state SET note = 'prep'")
        .await
        .unwrap();
    assert_eq!(
        code(&stale.batch_execute("EXECUTE p").await),
        "PF001",
        "EXECUTE of a prepared write"
    );
    assert_eq!(
        code(&stale.execute("EXECUTE p", &[]).await),
        "PF001",
        "EXECUTE via extended"
    );
    assert_eq!(code(&stale.batch_execute("DROP TABLE sweep_state").await), "PF001");
    // tokio-postgres leaves the connection unusable after a failed copy_in, so it goes last.
    let r = stale.copy_in::<_, bytes::Bytes>("COPY sweep_state FROM STDIN").await;
    assert_eq!(code(&r), "PF001", "COPY FROM");
    assert_eq!(digest(&f.admin).await, before, "a stale epoch changed the table");
}

#[tokio::test]
async fn current_epoch_writes_in_every_form() {
    for (i, sql) in FORMS.iter().enumerate() {
        let (f, _, current) = stale_and_current().await;
        let before = digest(&f.admin).await;
        let r = if sql.starts_with("COPY") {
            // tokio-postgres runs COPY only through its copy API.
            match current.copy_out(*sql).await {
                Ok(stream) => futures_util::TryStreamExt::try_collect::<Vec<_>>(stream)
                    .await
                    .map(|_| ()),
                Err(e) => Err(e),
            }
        } else if i % 2 == 0 {
            current.batch_execute(sql).await
        } else {
            current.execute(*sql, &[]).await.map(|_| ())
        };
        assert_eq!(code(&r), "ok", "{sql}");
        let changed = digest(&f.admin).await != before;
        let no_op = sql.contains("DO NOTHING") || sql.contains("USING audit") || sql.contains("FROM audit");
        assert!(changed || no_op, "{sql} did not write");
    }
}

#[tokio::test]
async fn pipelined_writes_are_each_checked() {
    let (f, stale, current) = stale_and_current().await;
    let stmt = current
        .prepare("UPDATE sweep_state SET note = $1 WHERE id = 1")
        .await
        .unwrap();
    let notes: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let results = join_all(notes.iter().map(|n| async { current.execute(&stmt, &[n]).await })).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(f.note().await.0, "p19");
    let stmt = stale
        .prepare("UPDATE sweep_state SET note = $1 WHERE id = 1")
        .await
        .unwrap();
    let results = join_all(notes.iter().map(|n| async { stale.execute(&stmt, &[n]).await })).await;
    assert!(results.iter().all(|r| code(r) == "PF001"), "{results:?}");
    // Reads pipelined with rejected writes still answer.
    let (a, b) = tokio::join!(stale.query_one("SELECT 1", &[]), stale.execute(&stmt, &[&"x"]));
    assert!(a.is_ok());
    assert_eq!(code(&b), "PF001");
    assert_eq!(f.note().await.0, "p19");
}

#[tokio::test]
async fn call_and_do_mentioning_a_fenced_table_are_pf004() {
    let (f, _, current) = stale_and_current().await;
    f.admin
        .batch_execute(
            "CREATE PROCEDURE touch(t text) LANGUAGE plpgsql AS $$ BEGIN EXECUTE format('UPDATE %I SET note = ''proc''', t); END $$",
        )
        .await
        .unwrap();
    for sql in [
        "DO $$ BEGIN UPDATE sweep_state SET note = 'do'; END $$",
        "CALL touch('sweep_state')",
    ] {
        assert_eq!(code(&current.batch_execute(sql).await), "PF004", "{sql}");
    }
    // Not mentioning a fenced table: passes (pgfence cannot see inside; the docs say so).
    current.batch_execute("DO $$ BEGIN PERFORM 1; END $$").await.unwrap();
    assert_eq!(f.note().await.0, "init");
}

#[tokio::test]
async fn rejection_inside_transaction_prevents_commit() {
    let (f, stale, _) = stale_and_current().await;
    stale
        .batch_execute("BEGIN; INSERT INTO audit (note) VALUES ('before')")
        .await
        .unwrap();
    assert_eq!(
        code(
            &stale
                .execute("UPDATE sweep_state SET note = 'x' WHERE id = 1", &[])
                .await
        ),
        "PF001"
    );
    assert_eq!(
        code(&stale.batch_execute("INSERT INTO audit (note) VALUES ('after')").await),
        "25P02"
    );
    stale.batch_execute("COMMIT").await.unwrap();
    let n = f.audit_rows().await;
    assert_eq!(n, 1, "only the row inserted before the test");
    // In one simple Query too.
    let r = stale
        .batch_execute("INSERT INTO audit (note) VALUES ('x'); UPDATE sweep_state SET note = 'x'")
        .await;
    assert_eq!(code(&r), "PF001");
    let n = f.audit_rows().await;
    assert_eq!(n, 1);
}

#[tokio::test]
async fn control_every_form_lands_without_pgfence() {
    let (f, _, _) = stale_and_current().await;
    let direct = f.direct().await;
    direct.batch_execute("SET pgfence.epoch = 1").await.unwrap();
    let before = digest(&f.admin).await;
    direct
        .batch_execute("UPDATE sweep_state SET note = 'stale'")
        .await
        .unwrap();
    assert_ne!(
        digest(&f.admin).await,
        before,
        "the control must show the stale write landing"
    );
}

/// A rejected COPY FROM in the extended protocol answers as any Execute-time
/// error: ParseComplete, BindComplete, ErrorResponse, ReadyForQuery.
#[tokio::test]
async fn rejected_copy_from_in_extended_protocol_answers_like_an_execute_error() {
    use crate::common::raw::{Raw, codes, message, tags};
    let (f, _, _) = stale_and_current().await;
    let params = [
        ("user", "postgres"),
        ("database", f.db.as_str()),
        ("pgfence.epoch", "1"),
    ];
    let (mut raw, _) = Raw::startup(f.proxy.port(), &params).await;
    let mut batch = message(b'P', b"\0COPY sweep_state FROM STDIN\0\0\0");
    batch.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
    batch.extend(message(b'E', b"\0\0\0\0\0"));
    batch.extend(message(b'S', b""));
    raw.send(&batch).await;
    let msgs = raw.read_until(|m| m.tag == b'Z').await;
    assert_eq!(tags(&msgs), "12EZ", "{msgs:?}");
    assert_eq!(codes(&msgs), ["PF001"]);
    let msgs = raw.simple("SELECT 1").await;
    assert_eq!(tags(&msgs), "TDCZ");
}

/// pgfence's refusals carry no CONTEXT naming the guard's PL/pgSQL internals, in either
/// protocol; a client's own error keeps its CONTEXT.
#[tokio::test]
async fn refusals_carry_no_guard_context() {
    use crate::common::raw::{Msg, bind, execute, parse, sync};
    let f = Fixture::at_epoch_two().await;
    let write = "UPDATE sweep_state SET note = 'x' WHERE id = 1";
    let error = |msgs: Vec<Msg>| msgs.into_iter().find(|m| m.tag == b'E').expect("an error");
    for (epoch, sql, want) in [
        ("1", write, "PF001"),
        ("", write, "PF002"),
        ("2", "SET pgfence.epoch = 0", "PF003"),
        ("2", "DO $$ BEGIN PERFORM 1 FROM sweep_state; END $$", "PF004"),
    ] {
        let mut s = if epoch.is_empty() {
            let params = [("user", "postgres"), ("database", f.db.as_str())];
            crate::common::raw::Raw::startup(f.proxy.port(), &params).await.0
        } else {
            f.raw(f.proxy.port(), epoch, &[]).await
        };
        let simple = error(s.simple(sql).await);
        s.send(&[parse("", sql), bind("", "", &[]), execute(""), sync()].concat())
            .await;
        let extended = error(s.read_until(|m| m.tag == b'Z').await);
        for (how, e) in [("simple", simple), ("extended", extended)] {
            assert_eq!(e.code().as_deref(), Some(want), "{sql} ({how})");
            assert_eq!(e.field(b'W'), None, "{sql} ({how})");
            assert!(e.field(b'H').is_some(), "{sql} ({how}): the hint stays");
        }
    }
    // A client's own error keeps its CONTEXT.
    let mut s = f.raw(f.proxy.port(), "2", &[]).await;
    let e = error(s.simple("DO $$ BEGIN RAISE EXCEPTION 'mine'; END $$").await);
    assert!(e.field(b'W').is_some_and(|w| w.contains("PL/pgSQL")), "{e:?}");
}

/// An error Postgres raises while the guard waits (here a lock timeout: a new epoch waits
/// for the old one's open transaction) loses the CONTEXT naming the guard's internals too,
/// in either protocol; its SQLSTATE and message stay Postgres'.
#[tokio::test]
async fn errors_met_inside_the_guard_carry_no_guard_context() {
    use crate::common::raw::{Msg, bind, execute, parse, sync};
    let f = Fixture::with(Cluster::shared(), super::NO_LEASE).await;
    let write = "UPDATE sweep_state SET note = 'x' WHERE id = 1";
    let old = f.leader(1).await;
    old.batch_execute(&format!("BEGIN; {write}")).await.unwrap();
    let error = |msgs: Vec<Msg>| msgs.into_iter().find(|m| m.tag == b'E').expect("an error");
    let mut s = f.raw(f.proxy.port(), "2", &[]).await;
    assert_eq!(
        codes(&s.simple("SET lock_timeout = '50ms'").await),
        Vec::<String>::new()
    );
    let simple = error(s.simple(write).await);
    s.send(&[parse("", write), bind("", "", &[]), execute(""), sync()].concat())
        .await;
    let extended = error(s.read_until(|m| m.tag == b'Z').await);
    for (how, e) in [("simple", simple), ("extended", extended)] {
        assert_eq!(e.code().as_deref(), Some("55P03"), "{how}: {e:?}");
        assert_eq!(
            e.field(b'M').as_deref(),
            Some("canceling statement due to lock timeout")
        );
        assert_eq!(e.field(b'W'), None, "{how}: {e:?}");
    }
    old.batch_execute("COMMIT").await.unwrap();
    assert!(
        codes(&s.simple(write).await).is_empty(),
        "once the old epoch's transaction ended"
    );
}

/// Fenced writes pipelined in one batch run under the batch's first guard: a second
/// guard between them would complete a statement of its own, which makes what a
/// suspended portal changed visible to the next write, as Postgres does not. Here the
/// second UPDATE must find the rows the first one (suspended after one row) changed
/// invisible, as straight to Postgres. A stale epoch is still refused at the first.
#[tokio::test]
async fn pipelined_writes_see_what_they_see_straight_to_postgres() {
    use crate::common::raw::{bind, codes, message, parse, sync};
    let f = Fixture::at_epoch_two().await;
    let update = "UPDATE sweep_state SET note = note || '+' RETURNING id";
    let execute_one = |portal: &str| {
        let mut body = portal.as_bytes().to_vec();
        body.push(0);
        body.extend_from_slice(&1i32.to_be_bytes());
        message(b'E', &body)
    };
    let batch = [
        parse("", update),
        bind("p", "", &[]),
        execute_one("p"),
        bind("q", "", &[]),
        crate::common::raw::execute("q"),
        sync(),
    ]
    .concat();
    let mut seen = Vec::new();
    for port in [f.proxy.port(), f.cluster.port()] {
        f.admin
            .batch_execute("UPDATE sweep_state SET note = 'init'")
            .await
            .unwrap();
        let mut s = f.raw(port, "2", &[]).await;
        s.send(&batch).await;
        let msgs = s.read_until(|m| m.tag == b'Z').await;
        let tags: Vec<String> = msgs
            .iter()
            .filter(|m| m.tag == b'C')
            .map(|m| String::from_utf8_lossy(&m.body).trim_end_matches('\0').to_owned())
            .collect();
        seen.push((crate::common::raw::tags(&msgs), tags, f.note().await.0));
    }
    assert_eq!(seen[0], seen[1], "through pgfence, then straight to Postgres");
    assert_eq!(seen[1].1, ["UPDATE 0"]);
    // A stale session's batch is refused before anything is written.
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    s.send(&batch).await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF001"]);
    assert_eq!(f.note().await.0, "init+");
}

/// A guard covers the later fenced writes of its batch only while nothing in between may
/// end the transaction. A name Postgres still holds as `COMMIT` (its redefinition as a
/// write was skipped after an error) may end it: pgfence cannot tell which definition
/// runs, so its Execute is refused (PF004) and nothing after it runs. Straight to Postgres
/// (the control) the takeover completes while the write after the `COMMIT` is open, and
/// that write commits after it, in a transaction no guard covers.
#[tokio::test]
async fn a_guard_covers_later_writes_only_while_nothing_between_may_end_the_transaction() {
    use std::time::Duration;

    use crate::common::raw::{bind, close_statement, codes, execute, parse, sync};
    let f = Fixture::new().await;
    f.admin
        .batch_execute("INSERT INTO sweep_state VALUES (2, 'init', 0)")
        .await
        .unwrap();
    for port in [f.proxy.port(), f.cluster.port()] {
        f.admin
            .batch_execute("UPDATE sweep_state SET note = 'init'")
            .await
            .unwrap();
        let e = f.takeover("a").await;
        let blocker = f.direct().await;
        blocker
            .batch_execute("BEGIN; SELECT 1 FROM sweep_state WHERE id = 2 FOR UPDATE")
            .await
            .unwrap();
        let mut s = f.raw(port, &e.to_string(), &[]).await;
        s.send(&[parse("c", "COMMIT"), sync()].concat()).await;
        s.read_until(|m| m.tag == b'Z').await;
        let skipped = [
            parse("bad", "SELECT 1/0"),
            bind("", "bad", &[]),
            execute(""),
            close_statement("c"),
            parse("c", "UPDATE sweep_state SET note = note || '+' WHERE id = 1"),
            sync(),
        ];
        let writes = [
            parse("w1", "UPDATE sweep_state SET note = 'w1' WHERE id = 1"),
            bind("", "w1", &[]),
            execute(""),
            bind("", "c", &[]),
            execute(""),
            parse("w2", "UPDATE sweep_state SET note = 'stale' WHERE id = 2"),
            bind("", "w2", &[]),
            execute(""),
            sync(),
        ];
        s.send(&[skipped.concat(), writes.concat()].concat()).await;
        s.read_until(|m| m.tag == b'Z').await;
        if port == f.proxy.port() {
            assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF004"]);
            blocker.batch_execute("ROLLBACK").await.unwrap();
            assert_eq!(f.note().await.0, "init");
            continue;
        }
        // w2 now waits for the blocker's row lock, in the transaction after the COMMIT.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let other = f.direct().await;
        let takeover = tokio::spawn(async move { super::take_lease(&other, "b").await });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let took_over_while_open = takeover.is_finished();
        blocker.batch_execute("ROLLBACK").await.unwrap();
        s.read_until(|m| m.tag == b'Z').await;
        takeover.await.unwrap();
        let row2: String = f
            .admin
            .query_one("SELECT note FROM sweep_state WHERE id = 2", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(row2, "stale");
        assert!(took_over_while_open);
    }
}

/// A child's rows show in its parent's scans: creating a child of a fenced table, or
/// linking a table to it as one, changes what the fenced table holds, and so does
/// unlinking one.
#[tokio::test]
async fn a_stale_epoch_cannot_add_or_remove_children_of_a_fenced_table() {
    let (f, stale, current) = stale_and_current().await;
    f.admin
        .batch_execute(
            "CREATE TABLE loose (id int NOT NULL, note text, last_epoch bigint NOT NULL DEFAULT 0);
             INSERT INTO loose VALUES (2, 'loose', 0)",
        )
        .await
        .unwrap();
    let rows = || async {
        f.admin
            .query_one("SELECT count(*) FROM sweep_state", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let link = [
        "CREATE TABLE kid () INHERITS (sweep_state)",
        "ALTER TABLE loose INHERIT sweep_state",
        "CREATE TABLE part PARTITION OF sweep_state DEFAULT",
    ];
    for sql in link {
        assert_eq!(code(&stale.batch_execute(sql).await), "PF001", "simple: {sql}");
        assert_eq!(code(&stale.execute(sql, &[]).await), "PF001", "extended: {sql}");
    }
    assert_eq!(rows().await, 1);
    // The current epoch links; a stale one cannot unlink.
    for sql in &link[..2] {
        assert_eq!(code(&current.batch_execute(sql).await), "ok", "{sql}");
    }
    assert_eq!(rows().await, 2);
    let unlink = "ALTER TABLE loose NO INHERIT sweep_state";
    assert_eq!(code(&stale.batch_execute(unlink).await), "PF001");
    assert_eq!(rows().await, 2);
    // Control: straight to Postgres the same change goes through.
    assert_eq!(code(&f.direct().await.batch_execute(unlink).await), "ok");
    assert_eq!(rows().await, 1);
}

/// Postgres renames a table, or one of its columns, by `ALTER INDEX`, `ALTER VIEW` and
/// `ALTER MATERIALIZED VIEW` too: from a stale epoch each is refused (PF001), as `ALTER
/// TABLE` is. Control: straight to Postgres each renames the fenced table.
#[tokio::test]
async fn a_stale_epoch_cannot_rename_a_fenced_table_by_another_alter() {
    let (f, stale, _current) = stale_and_current().await;
    let direct = f.direct().await;
    let renames = [
        (
            "ALTER INDEX sweep_state RENAME TO hidden",
            "ALTER TABLE hidden RENAME TO sweep_state",
        ),
        (
            "ALTER VIEW sweep_state RENAME COLUMN note TO hidden",
            "ALTER TABLE sweep_state RENAME COLUMN hidden TO note",
        ),
        (
            "ALTER MATERIALIZED VIEW public.sweep_state RENAME COLUMN note TO hidden",
            "ALTER TABLE sweep_state RENAME COLUMN hidden TO note",
        ),
    ];
    for (rename, back) in renames {
        assert_eq!(code(&stale.batch_execute(rename).await), "PF001", "simple: {rename}");
        assert_eq!(code(&stale.execute(rename, &[]).await), "PF001", "extended: {rename}");
        assert_eq!(code(&direct.batch_execute(rename).await), "ok", "control: {rename}");
        f.admin.batch_execute(back).await.unwrap();
    }
}

/// A fenced table can be a member of an extension (as PostGIS's `spatial_ref_sys` is of
/// PostGIS): `DROP EXTENSION` drops it and `ALTER EXTENSION … SET SCHEMA` moves it out of
/// its fence's name, so from a stale epoch both are refused (PF001) though they name no
/// table. Control: straight to Postgres the drop takes the fenced table with it.
#[tokio::test]
async fn a_stale_epoch_cannot_drop_or_move_an_extension_a_fenced_table_belongs_to() {
    let (f, stale, _current) = stale_and_current().await;
    f.admin
        .batch_execute("CREATE EXTENSION autoinc; ALTER EXTENSION autoinc ADD TABLE sweep_state; CREATE SCHEMA away")
        .await
        .unwrap();
    for sql in ["DROP EXTENSION autoinc", "ALTER EXTENSION autoinc SET SCHEMA away"] {
        assert_eq!(code(&stale.batch_execute(sql).await), "PF001", "simple: {sql}");
        assert_eq!(code(&stale.execute(sql, &[]).await), "PF001", "extended: {sql}");
    }
    assert_eq!(f.note().await.0, "init");
    f.direct().await.batch_execute("DROP EXTENSION autoinc").await.unwrap();
    let left: Option<String> = f
        .admin
        .query_one("SELECT to_regclass('public.sweep_state')::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, None, "control: the fenced table went with the extension");
}

/// Linking a table to a fenced one in a spelling pgfence's SQL parser cannot read (`ALTER
/// TABLE t * …`, several subcommands) is refused (PF004), not taken for a change of `t`
/// alone. Control: straight to Postgres the link is made and the partitioned parent
/// empties the fenced table.
#[tokio::test]
async fn a_stale_epoch_cannot_link_a_fenced_table_in_any_spelling() {
    let (f, stale, _current) = stale_and_current().await;
    f.admin
        .batch_execute(
            "CREATE TABLE ch (LIKE sweep_state); CREATE INDEX chi ON ch (id);
             CREATE TABLE pp (LIKE sweep_state) PARTITION BY RANGE (id)",
        )
        .await
        .unwrap();
    let links = [
        "ALTER TABLE ch * INHERIT sweep_state",
        "ALTER TABLE ch CLUSTER ON chi, INHERIT sweep_state",
        "ALTER TABLE pp * ATTACH PARTITION sweep_state FOR VALUES FROM (0) TO (100000)",
    ];
    for sql in links {
        assert_eq!(code(&stale.batch_execute(sql).await), "PF004", "simple: {sql}");
        assert_eq!(code(&stale.execute(sql, &[]).await), "PF004", "extended: {sql}");
    }
    assert_eq!(f.note().await.0, "init");
    // Control.
    f.direct()
        .await
        .batch_execute(&format!("{}; DELETE FROM pp", links[2]))
        .await
        .unwrap();
    let left: i64 = f
        .admin
        .query_one("SELECT count(*) FROM sweep_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

/// What pg_dump writes for a materialized view over a fenced table (`… WITH NO DATA`) and
/// for a subscription (`WITH (connect = false)`: no slot, no copy, no worker) restores
/// through pgfence as it does straight to Postgres: neither writes a fenced table.
#[tokio::test]
async fn pg_dumps_matview_and_subscription_forms_pass() {
    let (f, _stale, current) = stale_and_current().await;
    let matview = "CREATE MATERIALIZED VIEW sweep_mv AS SELECT id, note FROM sweep_state WITH NO DATA";
    let subscription = "CREATE SUBSCRIPTION pgfence_it_sub CONNECTION 'host=127.0.0.1 port=1 dbname=none' \
                        PUBLICATION p WITH (connect = false)";
    current.batch_execute(matview).await.unwrap();
    current
        .execute("REFRESH MATERIALIZED VIEW sweep_mv", &[])
        .await
        .unwrap();
    current.batch_execute(subscription).await.unwrap();
    // The way to drop one whose slot cannot be reached: none of these starts a write.
    for sql in [
        "ALTER SUBSCRIPTION pgfence_it_sub DISABLE",
        "ALTER SUBSCRIPTION pgfence_it_sub SET (slot_name = NONE)",
        "DROP SUBSCRIPTION pgfence_it_sub",
    ] {
        current.batch_execute(sql).await.unwrap();
    }
    // One that would connect and copy is refused.
    let copying = subscription.replace(" WITH (connect = false)", "");
    assert_eq!(code(&current.batch_execute(&copying).await), "PF004");
    assert_eq!(f.note().await.0, "init");
}

/// A statement that cannot run inside a transaction cannot share one with the guard:
/// `DETACH PARTITION … CONCURRENTLY` of a fenced partition fails with Postgres' 25001
/// whatever the epoch, and detaches nothing. Detached plainly, it is a fenced write:
/// refused at a stale epoch (PF001), run at the current one.
#[tokio::test]
async fn a_concurrent_detach_of_a_fenced_partition_cannot_be_guarded() {
    use crate::common::pg::Cluster;
    let toml = "[[fence]]\nname = \"parts\"\ntables = [\"part_a\"]\n";
    let f = Fixture::with(Cluster::shared(), toml).await;
    f.admin
        .batch_execute(
            "CREATE TABLE parted (id int) PARTITION BY RANGE (id);
             CREATE TABLE part_a PARTITION OF parted FOR VALUES FROM (0) TO (10);",
        )
        .await
        .unwrap();
    let attached = || async {
        let row = f
            .admin
            .query_one(
                "SELECT count(*) FROM pg_inherits WHERE inhrelid = 'part_a'::regclass",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == 1
    };
    let current = f.session("-c pgfence.epoch=2").await;
    current.batch_execute("INSERT INTO part_a VALUES (1)").await.unwrap();
    let detach = "ALTER TABLE parted DETACH PARTITION part_a";
    let r = current.batch_execute(&format!("{detach} CONCURRENTLY")).await;
    assert_eq!(code(&r), "25001");
    assert!(attached().await);
    let stale = f.session("-c pgfence.epoch=1").await;
    assert_eq!(code(&stale.batch_execute(detach).await), "PF001");
    assert!(attached().await);
    // Control: straight to Postgres the same stale session's detach runs.
    let direct = f.direct().await;
    direct.batch_execute("SET pgfence.epoch = 1").await.unwrap();
    direct.batch_execute(detach).await.unwrap();
    assert!(!attached().await);
    f.admin
        .batch_execute("ALTER TABLE parted ATTACH PARTITION part_a FOR VALUES FROM (0) TO (10)")
        .await
        .unwrap();
    current.batch_execute(detach).await.unwrap();
    assert!(!attached().await);
}

/// A column named `execute` is no `CREATE TABLE … AS EXECUTE`: the statement is read for
/// what it is, and the data-modifying `WITH` in it is a fenced write, refused at a stale
/// epoch (PF001) in both protocols. Taken for an `EXECUTE` of a name no one prepared, it
/// ran unguarded; straight to Postgres (the control) the stale write lands. Also where
/// what follows the column name could pass for a statement name and its arguments.
#[tokio::test]
async fn a_column_named_execute_hides_no_write() {
    let f = Fixture::at_epoch_two().await;
    let with = "CREATE TEMP TABLE t2 AS WITH u AS (UPDATE sweep_state SET note = 'stale' WHERE id = 1 RETURNING id)";
    for (sql, extended) in [
        (format!("{with} SELECT id AS execute FROM u"), false),
        (format!("{with} SELECT id AS execute FROM u"), true),
        (format!("{with} SELECT 1 AS execute WHERE (true)"), false),
        (format!("{with} SELECT (SELECT id FROM u) AS execute LIMIT (1)"), true),
    ] {
        let sql = sql.as_str();
        for port in [f.proxy.port(), f.cluster.port()] {
            let s = crate::common::pg::connect(port, &f.db, "-c pgfence.epoch=1").await;
            let r = if extended {
                s.execute(sql, &[]).await.map(|_| ())
            } else {
                s.batch_execute(sql).await
            };
            let got = r
                .err()
                .and_then(|e| e.code().map(|c| c.code().to_owned()))
                .into_iter()
                .collect();
            f.verdict(port, got, "PF001").await;
        }
    }
}

/// A configured name with capitals and no quotes (`Sweep_Log`) names `sweep_log`, as in SQL,
/// and the table created as `"Sweep_Log"` too, the one its writer most likely meant: both
/// are fenced. Control: straight to Postgres the stale writes land in both.
#[tokio::test]
async fn a_configured_name_with_capitals_fences_the_table_spelled_as_written_too() {
    let toml = "[[fence]]\nname = \"sweeper\"\ntables = [\"sweep_state\", \"Sweep_Log\"]\n";
    let f = Fixture::with(crate::common::pg::Cluster::shared(), toml).await;
    f.admin
        .batch_execute("CREATE TABLE \"Sweep_Log\" (id int, note text); CREATE TABLE sweep_log (id int, note text);")
        .await
        .unwrap();
    let current = f.leader(2).await;
    current
        .execute("UPDATE sweep_state SET note = 'b' WHERE id = 1", &[])
        .await
        .unwrap();
    let stale = f.leader(1).await;
    let none = f.session("").await;
    let writes = [
        "INSERT INTO \"Sweep_Log\" VALUES (1, 'stale')",
        "INSERT INTO public.\"Sweep_Log\" VALUES (1, 'stale')",
        "INSERT INTO sweep_log VALUES (1, 'stale')",
        "INSERT INTO Sweep_Log VALUES (1, 'stale')",
    ];
    for sql in writes {
        assert_eq!(code(&stale.simple_query(sql).await), "PF001", "{sql}");
        assert_eq!(code(&none.execute(sql, &[]).await), "PF002", "{sql}");
    }
    let count = "SELECT (SELECT count(*) FROM \"Sweep_Log\") + (SELECT count(*) FROM sweep_log)";
    let landed: i64 = f.admin.query_one(count, &[]).await.unwrap().get(0);
    assert_eq!(landed, 0);
    current.execute(writes[0], &[]).await.unwrap();
    current.execute(writes[2], &[]).await.unwrap();
    // Control: straight to Postgres, the stale session's writes land in both tables.
    let direct = f.direct().await;
    for sql in writes {
        direct.execute(sql, &[]).await.unwrap();
    }
    let landed: i64 = f.admin.query_one(count, &[]).await.unwrap().get(0);
    assert_eq!(landed, 2 + writes.len() as i64);
}

/// A table named with Unicode escapes (`U&"…"`) is the table Postgres names: an unfenced
/// one is written without an epoch, as straight to Postgres; a fenced one wants the epoch
/// (PF002 without one). A name whose escapes go beyond ASCII, which the server's encoding
/// decides, fails closed (PF004). The stale and current cases are in [`FORMS`].
#[tokio::test]
async fn a_unicode_escaped_table_name_is_the_table_postgres_names() {
    let f = Fixture::at_epoch_two().await;
    let none = f.session("").await;
    let unfenced = "UPDATE U&\"\\0061udit\" SET note = 'u'";
    none.batch_execute(unfenced).await.unwrap();
    none.execute(unfenced, &[]).await.unwrap();
    let fenced = "UPDATE U&\"sweep!005fstate\" UESCAPE '!' SET note = 'u' WHERE id = 1";
    assert_eq!(code(&none.batch_execute(fenced).await), "PF002");
    assert_eq!(code(&none.execute(fenced, &[]).await), "PF002");
    let current = f.leader(2).await;
    let beyond = "UPDATE U&\"sweep\\005fstat\\00e9\" SET note = 'u'";
    assert_eq!(code(&current.batch_execute(beyond).await), "PF004");
    assert_eq!(f.note().await.0, "init");
}
