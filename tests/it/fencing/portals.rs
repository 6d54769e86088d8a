//! Portals that run a write other than by the Execute that follows their Bind. SQL
//! `FETCH` and `MOVE` run a portal, and a portal bound with the protocol may hold a write:
//! Postgres runs an `INSERT`/`UPDATE`/`DELETE … RETURNING` (or a data-modifying WITH) at the
//! portal's first fetch, whichever way that fetch comes. And a Bind Postgres refuses leaves
//! the portal it would have replaced in place. Each case has its control straight to Postgres.

use super::Fixture;
use crate::common::raw::{Raw, bind, codes, execute, parse, query, sync, tags};

const STALE_UPDATE: &str = "UPDATE sweep_state SET note = 'stale' WHERE id = 1 RETURNING id";

/// Binds `sql` to `portal` and ends the batch with a Sync inside the open transaction
/// (the portal lives on to the transaction's end); the replies are checked.
async fn bind_portal(s: &mut Raw, portal: &str, sql: &str) {
    s.send(&[parse("", sql), bind(portal, "", &[]), sync()].concat()).await;
    assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "12Z");
}

/// `BEGIN`, a portal bound to a stale UPDATE, then the SQL command `run` on it and a
/// COMMIT; returns the error codes `run` got.
async fn fetch_in_transaction(s: &mut Raw, portal: &str, run: &str) -> Vec<String> {
    s.simple("BEGIN").await;
    bind_portal(s, portal, STALE_UPDATE).await;
    let got = codes(&s.simple(run).await);
    s.simple("COMMIT").await;
    got
}

#[tokio::test]
async fn a_portal_fetched_by_sql_is_checked_as_the_write_it_runs() {
    let f = Fixture::at_epoch_two().await;
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    for (portal, run) in [
        ("p", "FETCH ALL FROM p"),
        ("p", "FETCH p"),
        ("q", "MOVE ALL IN q"),
        ("Q r", "FETCH FORWARD 1 FROM \"Q r\""),
        ("p", "fetch next from U&\"\\0070\""),
    ] {
        assert_eq!(fetch_in_transaction(&mut s, portal, run).await, ["PF001"], "{run}");
        assert_eq!(f.note().await.0, "init", "{run}");
    }
    // Outside BEGIN: the Query that follows the Bind without a Sync runs in the same
    // implicit transaction, and commits it.
    s.send(&[parse("", STALE_UPDATE), bind("p", "", &[])].concat()).await;
    s.send(&query("FETCH ALL FROM p")).await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF001"]);
    s.send(&sync()).await;
    s.read_until(|m| m.tag == b'Z').await;
    // In a data-modifying WITH, and from a session that declared no epoch.
    let (mut none, started) = Raw::startup(f.proxy.port(), &[("user", "postgres"), ("database", &f.db)]).await;
    assert_eq!(started.last().map(|m| m.tag), Some(b'Z'));
    none.simple("BEGIN").await;
    bind_portal(
        &mut none,
        "w",
        "WITH u AS (UPDATE sweep_state SET note = 'stale' WHERE id = 1 RETURNING id) SELECT * FROM u",
    )
    .await;
    assert_eq!(codes(&none.simple("FETCH ALL FROM w").await), ["PF002"]);
    none.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "init");

    // The leader's fetch runs its write; a cursor of a plain SELECT needs no epoch.
    let mut leader = f.raw(f.proxy.port(), "2", &[]).await;
    leader.simple("BEGIN").await;
    bind_portal(
        &mut leader,
        "p",
        "UPDATE sweep_state SET note = 'leader' WHERE id = 1 RETURNING id",
    )
    .await;
    let fetched = leader.simple("FETCH ALL FROM p").await;
    assert!(codes(&fetched).is_empty(), "{fetched:?}");
    assert_eq!(tags(&fetched), "TDCZ");
    leader.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "leader");
    let got = none
        .simple("BEGIN; DECLARE c CURSOR FOR SELECT note FROM sweep_state; FETCH ALL FROM c; COMMIT")
        .await;
    assert!(codes(&got).is_empty(), "{got:?}");

    // Control: straight to Postgres the stale fetch commits its write.
    let mut d = f.raw(f.cluster.port(), "1", &[]).await;
    assert!(fetch_in_transaction(&mut d, "p", "FETCH ALL FROM p").await.is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// `BEGIN`, the unnamed portal bound to a stale write, a savepoint, a Bind of the unnamed
/// portal that Postgres refuses (one parameter too many, 08P01, before the old portal
/// goes), `ROLLBACK TO` the savepoint by a named portal, then Execute of the unnamed portal: it runs the
/// write, so pgfence checks the write. Returns the Execute's error codes.
async fn execute_after_a_refused_bind(s: &mut Raw) -> Vec<String> {
    s.simple("BEGIN").await;
    s.send(
        &[
            parse("", STALE_UPDATE),
            bind("", "", &[]),
            parse("sp", "SAVEPOINT sp"),
            bind("sp", "sp", &[]),
            execute("sp"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "1212CZ");
    s.send(&[parse("one", "SELECT 1"), bind("", "one", &["x"]), sync()].concat())
        .await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["08P01"]);
    // By portal: a simple Query would drop the unnamed portal.
    let rollback_to = [
        parse("rb", "ROLLBACK TO SAVEPOINT sp"),
        bind("rb", "rb", &[]),
        execute("rb"),
        sync(),
    ];
    s.send(&rollback_to.concat()).await;
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    s.send(&[execute(""), sync()].concat()).await;
    let got = codes(&s.read_until(|m| m.tag == b'Z').await);
    s.simple("COMMIT").await;
    got
}

#[tokio::test]
async fn a_refused_bind_leaves_the_portal_it_would_replace() {
    let f = Fixture::at_epoch_two().await;
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    assert_eq!(execute_after_a_refused_bind(&mut s).await, ["PF001"]);
    assert_eq!(f.note().await.0, "init");
    // Control: straight to Postgres the old portal's stale write commits.
    let mut d = f.raw(f.cluster.port(), "1", &[]).await;
    assert!(execute_after_a_refused_bind(&mut d).await.is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// A text pgfence takes whole (psql's routine-body rule decides its statement ends) that
/// fetches a portal bound to a stale write is refused.
#[tokio::test]
async fn a_fetch_inside_a_text_taken_whole_is_refused() {
    let f = Fixture::at_epoch_two().await;
    let text = "CREATE FUNCTION pg_temp.f(begin int) RETURNS int LANGUAGE sql AS 'select 1'; FETCH ALL FROM p";
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    s.simple("BEGIN").await;
    bind_portal(&mut s, "p", STALE_UPDATE).await;
    assert_eq!(codes(&s.simple(text).await), ["PF004"]);
    s.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "init");
    // Control.
    let mut d = f.raw(f.cluster.port(), "1", &[]).await;
    d.simple("BEGIN").await;
    bind_portal(&mut d, "p", STALE_UPDATE).await;
    assert!(codes(&d.simple(text).await).is_empty());
    d.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "stale");
}
