//! Rewrite-mode (row-level) fencing through the proxy, against a real Postgres.
//!
//! Every negative test has a control: the same write sent straight to
//! Postgres lands on the row a newer epoch wrote.

mod corpus;
mod interleave;
mod property;
mod protocol;

use pgfence::session::state::OwnStatement;
use tokio_postgres::Client;

use crate::common::pg::Cluster;
use crate::fencing::{Fixture, code};

/// A rewrite-mode fence on `sweep_state` and `items`, with the seed's lease.
pub fn lease_toml() -> String {
    format!("{}[fence.lease]\ntable = \"public.leader_lease\"\n", no_lease_toml())
}

/// The same fence without a lease: only the rows carry epochs.
pub fn no_lease_toml() -> String {
    "[[fence]]\nname = \"sweeper\"\ntables = [\"public.sweep_state\", \"public.items\"]\nmode = \"rewrite\"\n\
     epoch_column = \"last_epoch\"\n"
        .to_owned()
}

/// A fixture with a rewrite fence (`lease`: with the seed's lease table).
pub async fn fixture(lease: bool) -> Fixture {
    let toml = if lease { lease_toml() } else { no_lease_toml() };
    let f = Fixture::with(Cluster::shared(), &toml).await;
    f.admin
        .batch_execute("CREATE TABLE items (id int PRIMARY KEY, note text, n int, last_epoch bigint)")
        .await
        .unwrap();
    f
}

/// The note of row `id` of `items`.
async fn item_note(f: &Fixture, id: i32) -> String {
    f.admin
        .query_one("SELECT note FROM items WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

async fn update_note(c: &Client, note: &str) -> u64 {
    c.execute("UPDATE sweep_state SET note = $1 WHERE id = 1", &[&note])
        .await
        .unwrap()
}

/// One statement writing a reject-mode and a rewrite-mode fence's tables is refused
/// (PF004, before PF002), naming both fences and the reject fence's current epoch; nothing
/// of it is written. Control: straight to Postgres it writes both tables.
#[tokio::test]
async fn a_statement_writing_both_modes_is_refused_naming_both_fences() {
    let toml = format!("{}[[fence]]\nname = \"rej\"\ntables = [\"audit\"]\n", no_lease_toml());
    let f = Fixture::with(Cluster::shared(), &toml).await;
    f.admin
        .batch_execute("CREATE TABLE items (id int PRIMARY KEY, note text, n int, last_epoch bigint)")
        .await
        .unwrap();
    let both = "WITH a AS (INSERT INTO audit (note) VALUES ('both') RETURNING 1) \
                UPDATE sweep_state SET note = 'both' WHERE id = 1";
    for options in ["-c pgfence.fence=rej -c pgfence.epoch=3", ""] {
        let s = f.session(options).await;
        for r in [s.batch_execute(both).await, s.execute(both, &[]).await.map(|_| ())] {
            assert_eq!(code(&r), "PF004", "{options:?}");
            let message = r.unwrap_err().as_db_error().unwrap().message().to_owned();
            assert!(
                message.contains("reject-mode fence (\"rej\")")
                    && message.contains("rewrite-mode fence (\"sweeper\")")
                    && message.ends_with("(current epoch 0)"),
                "{message}"
            );
        }
    }
    assert_eq!(f.audit_rows().await, 0);
    assert_eq!(f.note().await.0, "init");
    f.direct().await.batch_execute(both).await.unwrap();
    assert_eq!(f.audit_rows().await, 1, "control");
    assert_eq!(f.note().await.0, "both", "control");
}

/// The seed's psql transcript, with pgfence applying the `last_epoch <=` check.
#[tokio::test]
async fn rewrite_seed_transcript_stale_update_touches_no_row() {
    let f = fixture(true).await;
    let e1 = f.takeover("node-a").await;
    let a = f.leader(e1).await;
    assert_eq!(update_note(&a, "a").await, 1);
    assert_eq!(f.note().await, ("a".to_owned(), e1));
    let e2 = f.takeover("node-b").await;
    let b = f.leader(e2).await;
    assert_eq!(update_note(&b, "b").await, 1);
    // node-a wakes up: its write reports UPDATE 0, and the simple protocol agrees.
    assert_eq!(update_note(&a, "a-stale").await, 0);
    simple_write_touches_no_row(&a, "a-stale").await;
    assert_eq!(f.note().await, ("b".to_owned(), e2));
}

/// The seed's "wrong" unconditional write through pgfence behaves like its
/// "right" version (`AND last_epoch <= 1`); sent directly it corrupts the row.
#[tokio::test]
async fn rewrite_unconditional_write_behaves_like_the_guarded_one() {
    let f = fixture(false).await;
    let b = f.leader(2).await;
    assert_eq!(update_note(&b, "b").await, 1);
    let direct = f.direct().await;
    let right = direct
        .execute(
            "UPDATE sweep_state SET note = 'a', last_epoch = 1 WHERE id = 1 AND last_epoch <= 1",
            &[],
        )
        .await
        .unwrap();
    let a = f.leader(1).await;
    let wrong = a
        .execute("UPDATE sweep_state SET note = 'a' WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!((right, wrong), (0, 0));
    assert_eq!(f.note().await, ("b".to_owned(), 2));
    // Control: the unconditional write straight to Postgres lands.
    let n = direct
        .execute("UPDATE sweep_state SET note = 'a', last_epoch = 1 WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!((n, f.note().await), (1, ("a".to_owned(), 1)));
}

#[tokio::test]
async fn rewrite_sets_the_epoch_on_insert_and_upsert_and_returns_rows() {
    let f = fixture(false).await;
    let s = f.leader(5).await;
    let rows = s
        .query(
            "INSERT INTO items (id, note, last_epoch) VALUES (1, 'x', 999), (2, 'y', NULL) RETURNING last_epoch",
            &[],
        )
        .await
        .unwrap();
    let epochs: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(epochs, vec![5, 5]);
    let old = f.leader(4).await;
    let n = old
        .execute(
            "INSERT INTO items (id, note) VALUES (1, 'old') ON CONFLICT (id) DO UPDATE SET note = excluded.note",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 0, "a stale upsert must not update the newer row");
    assert_eq!(item_note(&f, 1).await, "x");
}

#[tokio::test]
async fn rewrite_refusals_pf002_pf003_pf004() {
    let f = fixture(true).await;
    let e1 = f.takeover("node-a").await;
    let none = f.session("").await;
    let r = none.execute("DELETE FROM sweep_state", &[]).await;
    assert_eq!(code(&r), "PF002");
    let hint = r
        .unwrap_err()
        .as_db_error()
        .unwrap()
        .hint()
        .unwrap_or_default()
        .to_owned();
    assert!(hint.contains("SET pgfence.epoch = <epoch>"), "{hint}");
    assert_eq!(code(&none.batch_execute("DELETE FROM sweep_state").await), "PF002");
    assert_eq!(code(&none.batch_execute("SET pgfence.epoch = 0").await), "PF003");
    let above = f.leader(e1 + 1).await;
    assert_eq!(code(&above.batch_execute("DELETE FROM sweep_state").await), "PF003");
    let s = f.leader(e1).await;
    for sql in [
        "TRUNCATE sweep_state",
        "INSERT INTO sweep_state VALUES (2, 'x', 0)",
        "ALTER TABLE sweep_state ADD COLUMN z int",
        "DROP TABLE items",
        // Read as the fenced table, but not rewritable from that spelling. (Without a
        // backslash: the client sends it before the previous refusal's ReadyForQuery is in,
        // and a backslash would then be refused for that reason.)
        "UPDATE U&\"sweep!005fstate\" UESCAPE '!' SET note = 'u' WHERE id = 1",
    ] {
        let r = s.batch_execute(sql).await;
        assert_eq!(code(&r), "PF004", "{sql}");
        let e = r.unwrap_err();
        let db = e.as_db_error().unwrap();
        assert!(db.hint().is_some(), "{sql}: {e:?}");
        // Worded as reject mode's PF004: the fence, and the session's epoch.
        let message = db.message();
        assert!(
            message.starts_with("pgfence: ")
                && message.contains(&format!("(fence \"sweeper\"); refused at epoch {e1}")),
            "{sql}: {message}"
        );
    }
    // PF004 wins over PF002.
    assert_eq!(code(&none.batch_execute("TRUNCATE sweep_state").await), "PF004");
    assert_eq!(f.note().await, ("init".to_owned(), 0));
    s.batch_execute("UPDATE sweep_state SET note = 'ok' WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(f.note().await, ("ok".to_owned(), e1));
    // tokio-postgres leaves the connection unusable after a failed copy_in, so it goes last.
    let r = s.copy_in::<_, bytes::Bytes>("COPY sweep_state FROM STDIN").await;
    assert_eq!(code(&r), "PF004", "COPY FROM");
    assert_eq!(f.note().await, ("ok".to_owned(), e1));
}

/// A rewrite fence needs no HWM, but `pgfence init` is still the contract: without it the
/// guard (which then only proves the schema is there) fails with PF005, as in reject mode.
#[tokio::test]
async fn rewrite_database_without_init_gets_pf005() {
    let (cluster, db, _proxy) = crate::fencing::writes_without_init_get_pf005(&no_lease_toml()).await;
    let direct = crate::common::pg::connect(cluster.port(), &db, "").await;
    let note: String = direct
        .query_one("SELECT note FROM sweep_state WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(note, "init");
    // Control: straight to Postgres the same write lands.
    assert_eq!(update_note(&direct, "x").await, 1);
}

/// The contract checks every transaction: with a lease the guard runs once in each (it can
/// still refuse the epoch); without one each rewrite names the type `pgfence.epoch`. Either
/// way a schema dropped under a session is noticed at its next write, in either protocol.
#[tokio::test]
async fn rewrite_guard_runs_in_every_transaction() {
    for lease in [false, true] {
        let f = fixture(lease).await;
        let e = if lease { f.takeover("a").await } else { 3 };
        let c = f.leader(e).await;
        let mut calls = Vec::new();
        // Each transaction counts the calls its write added.
        for (i, extended) in [false, true, false, true].into_iter().enumerate() {
            c.batch_execute("BEGIN; SET LOCAL track_functions = 'pl'")
                .await
                .unwrap();
            let before = guard_calls(&c).await;
            let note = format!("w{i}");
            if extended {
                assert_eq!(update_note(&c, &note).await, 1);
            } else {
                c.batch_execute(&format!("UPDATE sweep_state SET note = '{note}' WHERE id = 1"))
                    .await
                    .unwrap();
            }
            calls.push(guard_calls(&c).await - before);
            c.batch_execute("COMMIT").await.unwrap();
            // Every write is still rewritten: it stamps the session's epoch.
            assert_eq!(f.note().await, (note, e), "lease: {lease}");
        }
        // Without a lease there is no guard to call. With one, the first transaction reads the fence row in `guard_slow`; later ones
        // run the guard's inline steady state. That each transaction still checks shows
        // below, once the schema is gone.
        let expected = if lease { [1, 0, 0, 0] } else { [0, 0, 0, 0] };
        assert_eq!(calls, expected, "guard calls per transaction, lease: {lease}");
        f.admin.batch_execute("DROP SCHEMA pgfence CASCADE").await.unwrap();
        assert_eq!(
            code(&c.batch_execute("UPDATE sweep_state SET note = 'x' WHERE id = 1").await),
            "PF005"
        );
        assert_eq!(
            code(&c.execute("UPDATE sweep_state SET note = 'x' WHERE id = 1", &[]).await),
            "PF005"
        );
    }
}

/// Without a lease, pgfence runs no statement of its own: each rewrite writes its epoch as
/// `N::pgfence.epoch`, so Postgres itself refuses the statement where the schema is gone
/// (PF005), also one prepared before it went (its plan depends on the type), or where the
/// schema is older than the type. A client's own missing type or schema in a rewritten
/// statement reaches it as Postgres raised it, at its position in the client's text.
#[tokio::test]
async fn without_a_lease_the_rewrite_alone_proves_the_schema() {
    let f = fixture(false).await;
    let c = f.leader(3).await;
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let last_query = || async {
        let row = f
            .admin
            .query_one("SELECT query FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .await
            .unwrap();
        row.get::<_, String>(0)
    };
    let write = |note: &str| format!("UPDATE sweep_state SET note = '{note}' WHERE id = 1");
    let rewrite = |note: &str| {
        format!(
            "UPDATE sweep_state SET note = '{note}', last_epoch = 3::pgfence.epoch WHERE (id = 1) \
             AND coalesce(sweep_state.last_epoch, 0) <= 3::pgfence.epoch"
        )
    };
    // The simple protocol, outside and inside a transaction block: the Query Postgres got
    // holds the rewrite and nothing before it.
    c.batch_execute(&write("w0")).await.unwrap();
    assert_eq!(last_query().await, rewrite("w0"));
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute(&write("w1")).await.unwrap();
    assert_eq!(last_query().await, rewrite("w1"));
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(f.note().await, ("w1".to_owned(), 3));
    // The extended protocol prepares no statement of pgfence's.
    let st = c
        .prepare("UPDATE sweep_state SET note = $1 WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(c.execute(&st, &[&"w2"]).await.unwrap(), 1);
    let own: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgfence%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(own, 0);
    // A stale session touches no row; straight to Postgres (the control) its write lands.
    simple_write_touches_no_row(&f.leader(2).await, "s").await;
    assert_eq!(f.note().await, ("w2".to_owned(), 3));

    // The client's own errors, in either protocol: code and position as Postgres gives
    // them for the client's text.
    for (sql, want) in [
        ("UPDATE sweep_state SET note = 'x'::nosuchtype WHERE id = 1", "42704"),
        ("UPDATE sweep_state SET note = 'x'::nosuch.t WHERE id = 1", "3F000"),
    ] {
        let at = sql.find("nosuch").unwrap() + 1;
        for r in [c.batch_execute(sql).await, c.execute(sql, &[]).await.map(|_| ())] {
            let e = r.unwrap_err();
            let e = e.as_db_error().unwrap();
            assert_eq!(e.code().code(), want, "{sql}: {e:?}");
            assert!(
                matches!(e.position(), Some(tokio_postgres::error::ErrorPosition::Original(p)) if *p as usize == at),
                "{sql}: {e:?}"
            );
        }
    }

    // An error raised while a statement runs names no type of pgfence's, whatever its
    // code: here 42704 for a setting nobody set, in the Query of a rewrite.
    let r = c
        .batch_execute(&format!("{}; SELECT current_setting('pgfence.fence')", write("g")))
        .await;
    assert_eq!(code(&r), "42704", "{r:?}");

    // A statement prepared and described before the schema goes (raw protocol, to describe it
    // again afterwards).
    use crate::common::raw::{self, Raw};
    let (mut old, _) = Raw::startup(
        f.proxy.port(),
        &[("user", "postgres"), ("database", &f.db), ("pgfence.epoch", "3")],
    )
    .await;
    let returning = "UPDATE sweep_state SET note = 'r' WHERE id = 1 RETURNING note";
    old.send(
        &[
            raw::parse("kept", returning),
            raw::describe_statement("kept"),
            raw::sync(),
        ]
        .concat(),
    )
    .await;
    let msgs = old.read_until(|m| m.tag == b'Z').await;
    assert_eq!(raw::tags(&msgs), "1tTZ");

    // A schema older than the type: PF005, naming the fence and the epoch. (The statement
    // prepared while the type was there is refused too, but with Postgres' own error: its
    // plan, made again, looks the type up by a number that names nothing now.)
    f.admin.batch_execute("DROP DOMAIN pgfence.epoch").await.unwrap();
    assert!(c.execute(&st, &[&"x"]).await.is_err());
    assert_eq!(f.note().await, ("w2".to_owned(), 3));
    for r in [
        c.batch_execute(&write("o")).await,
        c.execute(write("o").as_str(), &[]).await.map(|_| ()),
    ] {
        let e = r.unwrap_err();
        let e = e.as_db_error().unwrap().clone();
        assert_eq!(e.code().code(), "PF005", "{e:?}");
        assert!(e.message().contains("older than this pgfence"), "{e:?}");
        assert!(
            e.message().contains("fence \"sweeper\"") && e.message().contains("epoch 3"),
            "{e:?}"
        );
    }
    // No schema at all, also for the statements prepared while it was there, at Bind and
    // at Describe.
    f.admin.batch_execute("DROP SCHEMA pgfence CASCADE").await.unwrap();
    assert_eq!(code(&c.execute(&st, &[&"x"]).await), "PF005");
    old.send(&[raw::describe_statement("kept"), raw::sync()].concat()).await;
    let msgs = old.read_until(|m| m.tag == b'Z').await;
    assert_eq!(raw::codes(&msgs), ["PF005"], "{msgs:?}");
    assert_eq!(code(&c.batch_execute(&write("x")).await), "PF005");
    assert_eq!(f.note().await, ("w2".to_owned(), 3));
    // Control: straight to Postgres the write lands.
    assert_eq!(f.direct().await.execute(write("d").as_str(), &[]).await.unwrap(), 1);
}

/// A client's own value for the epoch column is replaced by the session's epoch, but
/// Postgres still analyses it: a mistake in it fails the statement with Postgres' error, at
/// its position in the client's text, as straight to Postgres, in either protocol.
#[tokio::test]
async fn a_client_value_for_the_epoch_column_is_analysed_not_written() {
    let f = fixture(false).await;
    let c = f.leader(3).await;
    let direct = f.direct().await;
    let error = |r: Result<(), tokio_postgres::Error>| {
        let e = r.unwrap_err();
        let e = e.as_db_error().unwrap_or_else(|| panic!("{e:?}")).clone();
        (e.code().code().to_owned(), format!("{:?}", e.position()))
    };
    for sql in [
        "UPDATE sweep_state SET last_epoch = nosuchcol WHERE id = 1",
        "UPDATE sweep_state SET last_epoch = '7'::nosuchtype WHERE id = 1",
        "UPDATE sweep_state SET last_epoch = 'abc' WHERE id = 1",
        "INSERT INTO sweep_state (id, note, last_epoch) VALUES (5, 'x', nosuchcol)",
        "INSERT INTO sweep_state (id, note, last_epoch) SELECT 5, 'x', nosuchcol FROM sweep_state",
    ] {
        let want = error(direct.batch_execute(sql).await);
        assert_ne!(want.0, "", "{sql}");
        assert_eq!(error(c.batch_execute(sql).await), want, "{sql}");
        assert_eq!(error(c.execute(sql, &[]).await.map(|_| ())), want, "{sql}");
    }
    // A valid value is still replaced: the row carries the session's epoch.
    c.batch_execute("UPDATE sweep_state SET note = 'v', last_epoch = 99 WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(f.note().await, ("v".to_owned(), 3));
    // Control: straight to Postgres the value is written.
    direct
        .batch_execute("UPDATE sweep_state SET last_epoch = 99 WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(f.note().await, ("v".to_owned(), 99));
}

/// With a lease, the simple protocol runs the guard as `EXECUTE` of the statement pgfence
/// prepares for the session's fence and epoch, as in reject mode: once per transaction, made
/// again for a new epoch, and still checking the lease (PF003 above it) while a stale
/// session's writes touch no row.
#[tokio::test]
async fn with_a_lease_the_simple_protocol_executes_the_prepared_guard() {
    let f = fixture(true).await;
    let e = f.takeover("a").await;
    let c = f.leader(e).await;
    let write = |note: &str| format!("UPDATE sweep_state SET note = '{note}' WHERE id = 1");
    // The first writes spell the guard out or run the one with parameters while pgfence
    // prepares the constant one; from then on each write runs that.
    for i in 0..3 {
        c.batch_execute(&write(&format!("p{i}"))).await.unwrap();
    }
    let first = once_per_transaction(&c, OwnStatement::ConstGuard).await;
    assert!(first >= 1, "{first}");
    assert_eq!(f.note().await, ("t2".to_owned(), e));
    let text = const_text(&c).await;
    assert!(
        text.contains(&format!(
            "pgfence.guard_lease('sweeper', {e}, 'public.leader_lease', false, EXISTS ("
        )),
        "{text}"
    );
    // A takeover: the old session's writes, through the same statement, touch no row.
    let e2 = f.takeover("b").await;
    let b = f.leader(e2).await;
    assert_eq!(update_note(&b, "b").await, 1);
    for note in ["s0", "s1"] {
        simple_write_touches_no_row(&c, note).await;
    }
    assert_eq!(const_runs(&c).await, first + 6);
    assert_eq!(f.note().await, ("b".to_owned(), e2));
    // A new epoch, above the lease's: the statement is made again for it, and refuses.
    c.batch_execute(&format!("SET pgfence.epoch = {}", e2 + 1))
        .await
        .unwrap();
    for i in 0..3 {
        assert_eq!(code(&c.batch_execute(&write(&format!("a{i}"))).await), "PF003");
    }
    assert_eq!(f.note().await, ("b".to_owned(), e2));
    let text = const_text(&c).await;
    assert!(
        text.contains(&format!("{}, 'public.leader_lease', false, EXISTS (", e2 + 1)),
        "{text}"
    );
    // Control: straight to Postgres the stale write lands.
    let direct = f.direct().await;
    direct
        .batch_execute(&format!(
            "UPDATE sweep_state SET note = 's', last_epoch = {e} WHERE id = 1"
        ))
        .await
        .unwrap();
    assert_eq!(f.note().await, ("s".to_owned(), e));
}

/// A simple-protocol write of `note` to `sweep_state`'s row that reports UPDATE 0.
async fn simple_write_touches_no_row(c: &Client, note: &str) {
    let msgs = c
        .simple_query(&format!("UPDATE sweep_state SET note = '{note}' WHERE id = 1"))
        .await
        .unwrap();
    assert!(
        matches!(
            msgs.last(),
            Some(tokio_postgres::SimpleQueryMessage::CommandComplete(0))
        ),
        "{msgs:?}"
    );
}

/// Three writes alone, then two in one transaction block: `own` runs once per transaction
/// (asserted). Returns how often it had run before them.
async fn once_per_transaction(c: &Client, own: OwnStatement) -> i64 {
    let write = |note: &str| format!("UPDATE sweep_state SET note = '{note}' WHERE id = 1");
    let names = [own.name()];
    let runs = || crate::fencing::own_statement::runs_of(c, &names);
    let first = runs().await;
    for i in 1..4 {
        c.batch_execute(&write(&format!("w{i}"))).await.unwrap();
    }
    assert_eq!(runs().await, first + 3, "{own:?}");
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute(&write("t1")).await.unwrap();
    c.batch_execute(&write("t2")).await.unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(runs().await, first + 4, "{own:?}");
    first
}

/// How often the session ran pgfence's constant guard statement (0 when it has none).
async fn const_runs(c: &Client) -> i64 {
    crate::fencing::own_statement::runs_of(c, &[OwnStatement::ConstGuard.name()]).await
}

/// The text of the session's constant guard statement.
async fn const_text(c: &Client) -> String {
    c.query_one(
        "SELECT statement FROM pg_prepared_statements WHERE name = $1",
        &[&OwnStatement::ConstGuard.name()],
    )
    .await
    .unwrap()
    .get(0)
}

/// Calls of `pgfence.guard` counted in this backend and not yet flushed to the shared
/// statistics (which carry over between transactions until a flush).
async fn guard_calls(c: &Client) -> i64 {
    c.query_one(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions WHERE funcname = 'guard_slow'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// `SET standard_conforming_strings = off` in flight, then a write whose strings end
/// elsewhere once it is off: with it on, pgfence would put its edits where Postgres then
/// reads a string, and the stale write would lower the row's epoch. A backslash in a
/// rewritten write is refused (PF004) while the setting is in flight, and rewritten by the
/// new rule once Postgres has answered.
#[tokio::test]
async fn rewrite_refuses_a_backslash_while_the_string_rules_may_change() {
    use crate::common::raw::{codes, query};
    let f = fixture(false).await;
    let b = f.leader(2).await;
    assert_eq!(update_note(&b, "b").await, 1);
    let hidden = "UPDATE sweep_state SET note = 'a\\' || ', last_epoch = 0 WHERE id = 1 AND note <> ' --'\n\
                  RETURNING id";
    let set_off = query("SET standard_conforming_strings = off");
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    s.send(&[set_off.clone(), query(hidden)].concat()).await;
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF004"]);
    assert_eq!(f.note().await, ("b".to_owned(), 2));
    // Sent once the answer is in, pgfence reads it with the setting off, as Postgres does,
    // and rewrites it: the client's `last_epoch = 0` goes, and the stale write changes no
    // row. (The notice is Postgres' 22P06 warning about `\'`.)
    let replies = s.simple(hidden).await;
    assert_eq!(codes(&replies), ["22P06"]);
    assert!(
        replies
            .iter()
            .any(|m| m.tag == b'C' && m.body.starts_with(b"UPDATE 0\0")),
        "{}",
        crate::common::raw::tags(&replies)
    );
    assert_eq!(f.note().await, ("b".to_owned(), 2));
    // A text without a backslash is rewritten in flight too: no row of epoch 2 changes.
    let plain = "UPDATE sweep_state SET note = 'a', last_epoch = 0 WHERE id = 1 RETURNING id";
    s.send(&[query("SET standard_conforming_strings = on"), query(plain)].concat())
        .await;
    s.read_until(|m| m.tag == b'Z').await;
    let done = s.read_until(|m| m.tag == b'Z').await;
    assert!(codes(&done).is_empty(), "{done:?}");
    assert_eq!(f.note().await, ("b".to_owned(), 2));
    // The current epoch's write lands, with its epoch and not the one hidden in the text.
    b.batch_execute("SET standard_conforming_strings = off").await.unwrap();
    b.batch_execute(hidden).await.unwrap();
    assert_eq!(f.note().await, ("a' || ".to_owned(), 2));
    // Control: the same text straight to Postgres lowers the row's epoch.
    let mut d = f.raw(f.cluster.port(), "1", &[]).await;
    d.send(&[set_off, query(hidden)].concat()).await;
    d.read_until(|m| m.tag == b'Z').await;
    let ran = d.read_until(|m| m.tag == b'Z').await;
    assert!(!ran.iter().any(|m| m.tag == b'E'), "{ran:?}");
    assert_eq!(f.note().await.1, 0);
}

/// Compact SQL, with no space between a value and the next keyword, runs rewritten as it
/// runs straight to Postgres: the epoch the rewrite adds is kept apart from the keyword.
#[tokio::test]
async fn rewrite_of_compact_sql_runs() {
    let f = fixture(false).await;
    let a = f.leader(5).await;
    for sql in [
        "UPDATE sweep_state SET note='x'WHERE id=1",
        "UPDATE sweep_state SET note='y'RETURNING id",
        "DELETE FROM sweep_state WHERE id IN (7,8)RETURNING id",
        "INSERT INTO sweep_state(id,note)SELECT 2,('z')RETURNING id",
    ] {
        a.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    assert_eq!(f.note().await, ("y".to_owned(), 5));
}

/// A string literal continued over a newline (`'a'` newline `'b'` is `'ab'` to Postgres) in
/// a rewritten write runs as it does straight to Postgres, in both protocols, and a stale
/// one still touches no row.
#[tokio::test]
async fn rewrite_of_a_continued_string_literal_runs() {
    let f = fixture(false).await;
    let a = f.leader(5).await;
    let sql = "UPDATE sweep_state SET note = 'a'\n'b' WHERE id = 1 AND note <> E'x'\n  -- c\n'y'";
    a.batch_execute(sql).await.unwrap_or_else(|e| panic!("simple: {e}"));
    assert_eq!(f.note().await, ("ab".to_owned(), 5));
    let b = f.leader(6).await;
    let prepared = "UPDATE sweep_state SET note = $1 || 'c'\n'd' WHERE id = 1";
    assert_eq!(b.execute(prepared, &[&"x"]).await.unwrap(), 1);
    assert_eq!(f.note().await, ("xcd".to_owned(), 6));
    assert_eq!(a.execute(sql, &[]).await.unwrap(), 0, "stale, extended protocol");
    assert_eq!(f.note().await, ("xcd".to_owned(), 6));
}

/// An INSERT whose query is not a plain SELECT is wrapped to add the epoch, and Postgres
/// still checks its outputs against the column list: one output too many is its 42601, as
/// straight to Postgres, not a row with a value dropped.
#[tokio::test]
async fn rewrite_of_insert_from_a_query_keeps_postgres_column_count_check() {
    let f = fixture(false).await;
    let a = f.leader(5).await;
    let direct = f.direct().await;
    let surplus = "INSERT INTO sweep_state (id, note) SELECT 10, 'a', 'extra' UNION ALL SELECT 11, 'b', 'extra'";
    let short = "INSERT INTO sweep_state (id, note) (SELECT 12)";
    for sql in [surplus, short] {
        assert_eq!(code(&a.batch_execute(sql).await), "42601", "{sql}");
        assert_eq!(code(&direct.batch_execute(sql).await), "42601", "control: {sql}");
    }
    let fine = "INSERT INTO sweep_state (id, note) SELECT 10, 'a' UNION ALL SELECT 11, 'b'";
    assert_eq!(a.execute(fine, &[]).await.unwrap(), 2);
    let epochs: Vec<i64> = f
        .admin
        .query("SELECT last_epoch FROM sweep_state WHERE id IN (10, 11)", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(epochs, [5, 5]);
}

/// Epoch columns and tables whose names are key words (quoted in the config, as in the
/// schema) or have non-ASCII letters (unquoted: Postgres folds only ASCII) are written as
/// Postgres reads them: every rewritten form runs and carries the epoch.
#[tokio::test]
async fn rewrite_of_tables_and_epoch_columns_named_like_key_words() {
    let toml = "[[fence]]\nname = \"kw\"\ntables = ['public.\"order\"', 'public.Ünï']\nmode = \"rewrite\"\n\
                epoch_column = 'Époch'\n";
    let f = crate::fencing::Fixture::with(Cluster::shared(), toml).await;
    f.admin
        .batch_execute(
            "CREATE TABLE \"order\" (id int PRIMARY KEY, a int, Époch bigint); \
             CREATE TABLE Ünï (id int PRIMARY KEY, a int, Époch bigint)",
        )
        .await
        .unwrap();
    let a = f.leader(4).await;
    for t in ["\"order\"", "Ünï"] {
        for sql in [
            format!("INSERT INTO {t} (id, a) VALUES (1, 1)"),
            format!("INSERT INTO {t} (id, a) VALUES (1, 2) ON CONFLICT (id) DO UPDATE SET a = excluded.a"),
            format!("UPDATE {t} SET a = 3 WHERE id = 1"),
        ] {
            a.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let row = f
            .admin
            .query_one(&format!("SELECT a, Époch FROM {t} WHERE id = 1"), &[])
            .await
            .unwrap();
        assert_eq!((row.get::<_, i32>(0), row.get::<_, i64>(1)), (3, 4), "{t}");
        a.batch_execute(&format!("DELETE FROM {t} WHERE id = 1")).await.unwrap();
    }
}
