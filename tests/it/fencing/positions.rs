//! Error positions: pgfence sends Postgres more than the client's text (a guard before a
//! fenced write, a rewritten statement), yet an error's position (`P`, what psql's caret
//! and drivers show) counts in the client's own text, exactly as straight to Postgres.

use tokio_postgres::Client;
use tokio_postgres::error::ErrorPosition;

use super::{Fixture, NO_LEASE, SEED_SQL, install};
use crate::common::inproc::Proxy;
use crate::common::pg::{Cluster, connect};

/// The SQLSTATE and position of the error `sql` gets in the simple protocol (`simple`) or
/// when prepared.
async fn error_at(c: &Client, sql: &str, simple: bool) -> (String, Option<u32>) {
    let r = if simple {
        c.batch_execute(sql).await
    } else {
        c.prepare(sql).await.map(drop)
    };
    let e = r.expect_err(sql);
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    let position = match db.position() {
        Some(ErrorPosition::Original(p)) => Some(*p),
        other => panic!("{sql}: position {other:?}"),
    };
    (db.code().code().to_owned(), position)
}

/// Each text fails with the same SQLSTATE and position through pgfence (`proxied`, at an
/// epoch it may write with) as straight to Postgres.
async fn same_positions(f: &Fixture, proxied: &Client, cases: &[&str], simple: bool) {
    let direct = f.direct().await;
    for sql in cases {
        let want = error_at(&direct, sql, simple).await;
        assert!(want.1.is_some(), "{sql}: no position straight to Postgres");
        assert_eq!(error_at(proxied, sql, simple).await, want, "{sql}");
    }
}

/// Reject mode: the guard spliced in before a fenced write moves nothing.
#[tokio::test]
async fn reject_mode_errors_point_into_the_clients_text() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let s = f.leader(1).await;
    s.batch_execute("UPDATE sweep_state SET note = 'ok' WHERE id = 1")
        .await
        .unwrap();
    let cases = [
        "UPDATE sweep_state SET note = 'é' WHERE id = 'abc'",
        "UPDATE sweep_state SET nope = 1 WHERE id = 1",
        "SELECT 'ü'; UPDATE sweep_state SET note = 'x' WHERE id = 'abc'",
        "UPDATE sweep_state SET note = 'x' WHERE id = 1; SELEC 3",
        "BEGIN; UPDATE sweep_state SET note = 'x' WHERE id = 1; INSERT INTO sweep_state (id) VALUES ('z')",
    ];
    same_positions(&f, &s, &cases, true).await;
}

/// A `SQL_ASCII` database keeps texts as it gets them and counts positions in bytes: the
/// positions pgfence gives back count in bytes too.
#[tokio::test]
async fn a_sql_ascii_database_counts_positions_in_bytes() {
    let cluster = Cluster::shared();
    let db = format!("{}_ascii", cluster.fresh_db().await);
    cluster
        .admin("postgres")
        .await
        .batch_execute(&format!(
            "CREATE DATABASE {db} TEMPLATE template0 ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
        ))
        .await
        .unwrap();
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install(&mut admin, cluster.port(), NO_LEASE).await;
    let proxy = Proxy::start(cluster.port(), NO_LEASE).await;
    let s = connect(proxy.port(), &db, "-c pgfence.epoch=1").await;
    let direct = connect(cluster.port(), &db, "").await;
    for sql in [
        // In bytes `nope` lies past the end of the text before the guard counted in characters.
        "SELECT 'éééééééééé', nope; UPDATE sweep_state SET note = 'x' WHERE id = 1",
        "SELECT 'ééé'; UPDATE sweep_state SET note = 'ü' WHERE id = 'abc'",
    ] {
        let want = error_at(&direct, sql, true).await;
        assert!(want.1.is_some(), "{sql}");
        assert_eq!(error_at(&s, sql, true).await, want, "{sql}");
    }
}

/// Rewrite mode: positions inside the rewritten statement (its added predicate and
/// column) and after it count in the client's statement, in both protocols.
#[tokio::test]
async fn rewrite_mode_errors_point_into_the_clients_text() {
    let f = crate::rewrite::fixture(false).await;
    let s = f.leader(1).await;
    let cases = [
        "UPDATE sweep_state SET note = 'x' WHERE id = 'abc'",
        "UPDATE sweep_state SET note = 'é', nope = 1 WHERE id = 1 OR id = 2",
        "INSERT INTO sweep_state (id, note) VALUES ('abc', 'x')",
        "DELETE FROM sweep_state WHERE id = 'abc' RETURNING nope",
        // Refused by Postgres (42803) with or without pgfence: the epoch output is a column
        // beside an aggregate, so the query is wrapped and keeps its error.
        "INSERT INTO sweep_state (id, last_epoch) SELECT max(id) + 1, last_epoch FROM sweep_state",
    ];
    same_positions(&f, &s, &cases, true).await;
    same_positions(&f, &s, &cases, false).await;
    let simple_only = [
        "SELECT 'ü'; UPDATE sweep_state SET note = 'x' WHERE id = 'abc'",
        "UPDATE sweep_state SET note = 'x' WHERE id = 1; SELEC 3",
    ];
    same_positions(&f, &s, &simple_only, true).await;
}

/// A rewritten prepared statement whose column was dropped since fails when Postgres plans
/// it again: at the next Bind (same epoch), or when pgfence prepares it again for a new
/// epoch. Either way the error's SQLSTATE and position are Postgres' own in the client's
/// text, as straight to Postgres.
#[tokio::test]
async fn a_statement_planned_again_points_into_the_clients_text() {
    for new_epoch in [false, true] {
        let f = crate::rewrite::fixture(false).await;
        let sql = "UPDATE items SET note = $1 WHERE n = 1";
        let s = f.leader(1).await;
        let proxied = s.prepare(sql).await.unwrap();
        let direct = f.direct().await;
        let prepared = direct.prepare(sql).await.unwrap();
        f.admin.batch_execute("ALTER TABLE items DROP COLUMN n").await.unwrap();
        if new_epoch {
            s.batch_execute("SET pgfence.epoch = 2").await.unwrap();
        }
        let at = |r: Result<u64, tokio_postgres::Error>| {
            let e = r.expect_err("column n is gone");
            let db = e.as_db_error().cloned().unwrap_or_else(|| panic!("{e}"));
            (db.code().code().to_owned(), db.position().cloned())
        };
        let want = at(direct.execute(&prepared, &[&"x"]).await);
        assert_eq!(want.0, "42703");
        assert!(want.1.is_some());
        assert_eq!(at(s.execute(&proxied, &[&"x"]).await), want, "new epoch: {new_epoch}");
    }
}

/// A re-prepare for a new epoch that fails on the client's own statement (a table it reads
/// was dropped) reports Postgres' error (42P01), not pgfence's PF005 for a missing schema.
#[tokio::test]
async fn a_failed_re_prepare_keeps_the_clients_sqlstate() {
    let f = crate::rewrite::fixture(false).await;
    f.admin
        .batch_execute("CREATE TABLE aux (note text); INSERT INTO aux VALUES ('a')")
        .await
        .unwrap();
    let sql = "UPDATE items SET note = (SELECT note FROM aux LIMIT 1) WHERE id = $1";
    let s = f.leader(1).await;
    let proxied = s.prepare(sql).await.unwrap();
    let direct = f.direct().await;
    let prepared = direct.prepare(sql).await.unwrap();
    f.admin.batch_execute("DROP TABLE aux").await.unwrap();
    s.batch_execute("SET pgfence.epoch = 2").await.unwrap();
    let want = super::code(&direct.execute(&prepared, &[&1i32]).await);
    assert_eq!(want, "42P01");
    assert_eq!(super::code(&s.execute(&proxied, &[&1i32]).await), want);
}

/// Rewrite mode refuses a write it cannot read (PF004) by a rejection put before it, the
/// statement staying as written: a text with a statement that does not parse still fails
/// whole, with Postgres' own error and position, before any of its statements runs.
#[tokio::test]
async fn an_unparsable_write_fails_the_whole_text_before_anything_runs() {
    let f = crate::rewrite::fixture(false).await;
    let s = f.leader(5).await;
    let sql = "INSERT INTO audit (note) VALUES ('before'); COMMIT; UPDATE sweep_state SET note = 'x' WHERE id =";
    let want = error_at(&f.direct().await, sql, true).await;
    assert_eq!(want.0, "42601");
    assert_eq!(error_at(&s, sql, true).await, want);
    assert_eq!(f.audit_rows().await, 0);
    // A write it cannot rewrite that does parse is refused where it stands.
    let truncate = "INSERT INTO audit (note) VALUES ('kept'); TRUNCATE sweep_state";
    let e = s.batch_execute(truncate).await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("PF004"));
    assert_eq!(f.audit_rows().await, 0, "one implicit transaction");
    assert_eq!(f.note().await.0, "init");
}
