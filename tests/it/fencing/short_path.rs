//! The guard's short path (`0002_fast_guard.sql`): the steady state passes with one read
//! and no `search_path` of its own, and nothing it skips lets a stale epoch through — not a
//! rolled-back bump, not a hand-set marker, not a hostile `search_path`, not a disabled
//! lease trigger. Each test has its control: the same write straight to Postgres lands.

use super::{Fixture, NO_LEASE, code};
use crate::common::pg::Cluster;

const WRITE: &str = "UPDATE sweep_state SET note = 'w' WHERE id = 1";

/// The marker the full guard leaves: what the short path trusts.
async fn marker(client: &tokio_postgres::Client) -> String {
    client
        .query_one(
            "SELECT coalesce(current_setting('pgfence.guard_passed', true), '')",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Sets the marker by hand, as a client could.
async fn set_marker(client: &tokio_postgres::Client, value: &str) {
    client
        .execute("SELECT set_config('pgfence.guard_passed', $1, false)", &[&value])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_rolled_back_bump_takes_its_marker_with_it() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let five = f.leader(5).await;
    five.batch_execute(&format!("BEGIN; {WRITE}")).await.unwrap();
    assert_eq!(
        marker(&five).await,
        "5 sweeper",
        "the bump left its marker in the transaction"
    );
    five.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(marker(&five).await, "", "the marker rolled back with the bump");
    assert_eq!(f.hwm().await, 0);
    // The HWM never reached 5, so epoch 3 may still write ...
    f.leader(3).await.execute(WRITE, &[]).await.unwrap();
    // ... and the epoch-5 session bumps again rather than trusting a marker it no longer has.
    five.execute(WRITE, &[]).await.unwrap();
    assert_eq!(f.hwm().await, 5);
    assert_eq!(code(&f.leader(3).await.execute(WRITE, &[]).await), "PF001");
    // Steady state: the short path lets the current epoch through, again and again.
    for _ in 0..3 {
        five.execute(WRITE, &[]).await.unwrap();
    }
    // Control: straight to Postgres the stale epoch's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

#[tokio::test]
async fn a_hand_set_marker_changes_nothing() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    f.leader(2).await.execute(WRITE, &[]).await.unwrap();
    let direct = f.direct().await;
    // A marker claiming the HWM reached 9: the short path finds 2 and hands over to the
    // full guard, which bumps properly.
    set_marker(&direct, "9 sweeper").await;
    direct
        .batch_execute("SELECT pgfence.guard('sweeper', 9, NULL, true)")
        .await
        .unwrap();
    assert_eq!(f.hwm().await, 9);
    // A marker for a stale epoch does not make it current.
    set_marker(&direct, "4 sweeper").await;
    assert_eq!(
        code(
            &direct
                .batch_execute("SELECT pgfence.guard('sweeper', 4, NULL, true)")
                .await
        ),
        "PF001"
    );
    // Control: without the guard the stale session writes.
    assert_eq!(direct.execute(WRITE, &[]).await.unwrap(), 1);
}

#[tokio::test]
async fn a_hostile_search_path_does_not_change_the_verdict() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    f.leader(7).await.execute(WRITE, &[]).await.unwrap();
    // Operators that say every bigint equals, and is at least, every other one.
    f.admin
        .batch_execute(
            "CREATE SCHEMA evil;
             CREATE FUNCTION evil.yes(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true';
             CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes);
             CREATE OPERATOR evil.>= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes);
             CREATE OPERATOR evil.<= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes);
             CREATE FUNCTION evil.yes_text(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
             CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes_text);",
        )
        .await
        .unwrap();
    let stale = f.leader(3).await;
    stale
        .batch_execute("SET search_path = evil, pg_catalog, public")
        .await
        .unwrap();
    // The control for the operators: unqualified, they do lie in this session.
    let lie: bool = stale
        .query_one("SELECT 3::bigint = 7::bigint", &[])
        .await
        .unwrap()
        .get(0);
    assert!(lie, "the hostile operator is in effect");
    set_marker(&stale, "3 sweeper").await;
    assert_eq!(code(&stale.execute(WRITE, &[]).await), "PF001");
    assert_eq!(f.hwm().await, 7);
    // A session that reached the inline path at the current epoch, then declares a stale
    // one: its marker names the old epoch, and no = of the search_path may say otherwise.
    let moved = f.leader(7).await;
    for _ in 0..3 {
        moved.execute(WRITE, &[]).await.unwrap();
    }
    moved
        .batch_execute("SET search_path = evil, pg_catalog, public; SET pgfence.epoch = 3")
        .await
        .unwrap();
    assert_eq!(code(&moved.execute(WRITE, &[]).await), "PF001");
    assert_eq!(code(&moved.batch_execute(WRITE).await), "PF001");
    // Control: straight to Postgres the same session's write lands.
    let direct = f.direct().await;
    direct
        .batch_execute("SET search_path = evil, pg_catalog, public")
        .await
        .unwrap();
    assert_eq!(direct.execute(WRITE, &[]).await.unwrap(), 1);
}

#[tokio::test]
async fn a_disabled_lease_trigger_is_noticed_after_the_short_path_ran() {
    let f = Fixture::new().await;
    let epoch = f.takeover("a").await;
    let leader = f.leader(epoch).await;
    for _ in 0..3 {
        leader.execute(WRITE, &[]).await.unwrap();
    }
    f.admin
        .batch_execute("ALTER TABLE leader_lease DISABLE TRIGGER pgfence_lease")
        .await
        .unwrap();
    assert_eq!(code(&leader.execute(WRITE, &[]).await), "PF005");
    // Control: straight to Postgres nothing notices.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// Version 12: the lease triggers count only as `init` installs them, both, enabled ALWAYS.
/// `ENABLE TRIGGER ALL` (what a restore with `--disable-triggers` leaves) enables them the
/// default way, which does not fire under `session_replication_role = replica`: a takeover
/// made there left the fence behind, and the old leader wrote on. A dropped TRUNCATE trigger
/// let a TRUNCATE revoke nothing.
#[tokio::test]
async fn lease_triggers_count_only_as_init_installs_them() {
    let mut f = Fixture::new().await;
    let epoch = f.takeover("a").await;
    let old = f.leader(epoch).await;
    for _ in 0..3 {
        old.execute(WRITE, &[]).await.unwrap();
    }
    f.admin
        .batch_execute("ALTER TABLE leader_lease DISABLE TRIGGER ALL; ALTER TABLE leader_lease ENABLE TRIGGER ALL")
        .await
        .unwrap();
    let replica = f.direct().await;
    replica
        .batch_execute("SET session_replication_role = replica")
        .await
        .unwrap();
    let new = super::take_lease(&replica, "b").await;
    assert_eq!(new, epoch + 1);
    // The takeover went unseen by the fence; the old leader's writes are refused anyway, in
    // both protocols, and so are the new leader's until init runs.
    assert_eq!(code(&old.execute(WRITE, &[]).await), "PF005");
    assert_eq!(code(&old.batch_execute(WRITE).await), "PF005");
    assert_eq!(code(&f.leader(new).await.execute(WRITE, &[]).await), "PF005");
    assert_eq!(f.note().await.0, "w");
    // Control: straight to Postgres the old leader's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
    // init puts the triggers back and brings the fence up to the lease row.
    let port = f.cluster.port();
    super::install(&mut f.admin, port, &super::fence_toml()).await;
    assert_eq!(code(&old.execute(WRITE, &[]).await), "PF001");
    let leader = f.leader(new).await;
    leader.execute(WRITE, &[]).await.unwrap();
    // Without the TRUNCATE trigger, a TRUNCATE would revoke nothing: refused too.
    f.admin
        .batch_execute("ALTER TABLE leader_lease DISABLE TRIGGER pgfence_lease_truncate")
        .await
        .unwrap();
    assert_eq!(code(&leader.execute(WRITE, &[]).await), "PF005");
    assert_eq!(code(&leader.batch_execute(WRITE).await), "PF005");
    f.admin
        .batch_execute("ALTER TABLE leader_lease ENABLE ALWAYS TRIGGER pgfence_lease_truncate")
        .await
        .unwrap();
    leader.execute(WRITE, &[]).await.unwrap();
}

/// Version 6: in the steady state the guard is an inlined expression, not a PL/pgSQL
/// call. The bump goes to the full guard; the first call after it reads the row in
/// `guard_slow` and records the count; later calls call no PL/pgSQL function at all. A
/// stale epoch still reaches the full guard, which refuses it.
#[tokio::test]
async fn the_steady_state_calls_no_plpgsql_function() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let direct = f.direct().await;
    let calls = |name: &'static str| {
        let direct = &direct;
        async move {
            direct
                .query_one(
                    "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions WHERE funcname = $1",
                    &[&name],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    // Counts not yet flushed stay in the view after a commit: compare differences.
    let both = || async { (calls("guard_slow").await, calls("guard_full").await) };
    let since = |(a, b): (i64, i64), (c, d): (i64, i64)| (c - a, d - b);
    let guard = "SELECT pgfence.guard('sweeper', 5, NULL, true)";
    direct
        .batch_execute("BEGIN; SET LOCAL track_functions = 'pl'")
        .await
        .unwrap();
    let start = both().await;
    direct.batch_execute(guard).await.unwrap();
    assert_eq!(since(start, both().await), (1, 1), "the bump");
    direct.batch_execute("COMMIT").await.unwrap();
    direct
        .batch_execute("BEGIN; SET LOCAL track_functions = 'pl'")
        .await
        .unwrap();
    let start = both().await;
    for _ in 0..4 {
        direct.batch_execute(guard).await.unwrap();
    }
    assert_eq!(since(start, both().await), (1, 0), "one read, then inline");
    // Prepared, as pgfence runs it, too.
    let prepared = direct.prepare("SELECT pgfence.guard($1, $2, $3, $4)").await.unwrap();
    for _ in 0..8 {
        direct
            .execute(&prepared, &[&"sweeper", &5i64, &None::<&str>, &true])
            .await
            .unwrap();
    }
    assert_eq!(since(start, both().await), (1, 0), "prepared");
    // Still under the fence's lock, held shared to the transaction's end. (Only this
    // session's locks count: other tests share the cluster.)
    let pid: i32 = direct.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let held: i64 = f
        .admin
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock' AND granted \
             AND pid = $1",
            &[&pid],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 1);
    direct.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        code(
            &direct
                .batch_execute("SELECT pgfence.guard('sweeper', 4, NULL, true)")
                .await
        ),
        "PF001"
    );
}

/// How many times the fence row was read in the current transaction (by either guard).
async fn fence_reads(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT (coalesce(seq_scan, 0) + coalesce(idx_scan, 0))::bigint \
               FROM pg_stat_xact_user_tables WHERE schemaname = 'pgfence' AND relname = 'fence'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Version 5: once a session has read HWM = epoch, the short path stops reading the row
/// until some fence row changes; every way of changing it is noticed.
#[tokio::test]
async fn the_short_path_reads_the_fence_row_again_only_after_it_changed() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let direct = f.direct().await;
    let guard = |epoch: i64| format!("SELECT pgfence.guard('sweeper', {epoch}, NULL, true)");
    direct.batch_execute(&guard(5)).await.unwrap(); // the bump: full guard
    direct.batch_execute("BEGIN").await.unwrap();
    direct.batch_execute(&guard(5)).await.unwrap(); // short path: reads the row once ...
    let first = fence_reads(&direct).await;
    assert!(first >= 1, "the short path read the row ({first})");
    for _ in 0..3 {
        direct.batch_execute(&guard(5)).await.unwrap(); // ... and then no more
    }
    assert_eq!(fence_reads(&direct).await, first, "steady state reads nothing");
    direct.batch_execute("COMMIT").await.unwrap();

    // A hand-made change, another session's bump, and a bump made with triggers off (which the
    // full guard counts itself): after each, the session that skipped the read is refused.
    let bumps = [
        "UPDATE pgfence.fence SET hwm = 6 WHERE name = 'sweeper'",
        "SELECT pgfence.guard('sweeper', 7, NULL, true)",
        "SET session_replication_role = replica; SELECT pgfence.guard('sweeper', 8, NULL, true); \
         RESET session_replication_role",
    ];
    let mut epoch = 5;
    for bump in bumps {
        let leader = f.leader(epoch).await;
        leader.execute(WRITE, &[]).await.unwrap(); // reads HWM = epoch, records the count
        leader.execute(WRITE, &[]).await.unwrap(); // steady state
        f.admin.batch_execute(bump).await.unwrap();
        assert_eq!(code(&leader.execute(WRITE, &[]).await), "PF001", "after {bump}");
        epoch = f.hwm().await;
    }
    assert_eq!(epoch, 8);
    // A rolled-back bump is counted too: the next call reads again and still passes.
    let leader = f.leader(8).await;
    leader.execute(WRITE, &[]).await.unwrap();
    f.admin
        .batch_execute("BEGIN; UPDATE pgfence.fence SET hwm = 20 WHERE name = 'sweeper'; ROLLBACK")
        .await
        .unwrap();
    leader.execute(WRITE, &[]).await.unwrap();
    assert_eq!(f.hwm().await, 8);
    // Control: straight to Postgres the stale epoch's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// A transaction sees its own bump of the HWM before it commits, and `ROLLBACK PREPARED`
/// can still take that bump away after `PREPARE TRANSACTION` kept the session's settings as
/// a commit would. Recording the count there left a marker for a HWM that never committed:
/// the new epoch then wrote without raising the HWM, and the old leader wrote after it. Also
/// after `RESET ALL` in that transaction (settings cleared, the bump kept).
#[tokio::test]
async fn a_bump_rolled_back_after_prepare_transaction_is_not_trusted() {
    // A savepoint rolled back makes pgfence guard the next write again: the second guard
    // of the transaction reads its own HWM, 4 (the third, after RESET ALL).
    let again = format!("SAVEPOINT s; ROLLBACK TO SAVEPOINT s; {WRITE}");
    for (i, between) in [again.clone(), format!("RESET ALL; {WRITE}; {again}; {again}")]
        .iter()
        .enumerate()
    {
        let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
        let old = f.leader(3).await;
        old.execute(WRITE, &[]).await.unwrap();
        let new = f.leader(4).await;
        new.batch_execute(&format!("BEGIN; {WRITE}; {between}; PREPARE TRANSACTION 'pf_bump_{i}'"))
            .await
            .unwrap();
        f.admin
            .batch_execute(&format!("ROLLBACK PREPARED 'pf_bump_{i}'"))
            .await
            .unwrap();
        assert_eq!(f.hwm().await, 3, "the bump was rolled back ({between})");
        // The new epoch's next write bumps for real ...
        new.execute(WRITE, &[]).await.unwrap();
        assert_eq!(f.hwm().await, 4, "{between}");
        // ... so the old leader is refused.
        assert_eq!(code(&old.execute(WRITE, &[]).await), "PF001", "{between}");
        // Control: straight to Postgres the old leader's write lands.
        assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
    }
}

/// A writer that passed the short path holds its lock until it commits: a hand-made change
/// waits for it, and the writers after the change see it.
#[tokio::test]
async fn a_hand_made_change_waits_for_writers_past_the_short_path() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let leader = f.leader(3).await;
    leader.execute(WRITE, &[]).await.unwrap();
    leader.execute(WRITE, &[]).await.unwrap();
    leader.batch_execute(&format!("BEGIN; {WRITE}")).await.unwrap();
    let admin = f.direct().await;
    let change = tokio::spawn(async move {
        admin
            .batch_execute("UPDATE pgfence.fence SET hwm = 4 WHERE name = 'sweeper'")
            .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!change.is_finished(), "the change waits for the writer past the guard");
    leader.batch_execute("COMMIT").await.unwrap();
    change.await.unwrap().unwrap();
    assert_eq!(code(&leader.execute(WRITE, &[]).await), "PF001");
}

/// A login role for `f`'s database with UPDATE on `sweep_state` and these further grants
/// (`{role}` names it), as an application would have.
async fn app_role(f: &Fixture, grants: &str) -> String {
    let role = format!("app_{}", f.db);
    let grants = grants.replace("{role}", &role);
    f.admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT, UPDATE ON sweep_state TO {role}; {grants}"
        ))
        .await
        .unwrap();
    role
}

/// A session as `role` on `port` (pgfence's or Postgres'), declaring `epoch` if given.
async fn connect_as(f: &Fixture, port: u16, role: &str, epoch: Option<i64>) -> tokio_postgres::Client {
    use crate::common::pg::{config, connect_config};
    let mut c = config(port, &f.db);
    c.user(role);
    if let Some(epoch) = epoch {
        c.options(format!("-c pgfence.epoch={epoch}"));
    }
    connect_config(&c).await.unwrap()
}

/// An application role needs no grant on the `pgfence` schema beyond what `init` gives
/// everyone: both guards run with the installer's rights, on the short path and off it.
#[tokio::test]
async fn an_application_role_needs_only_what_init_grants() {
    let f = Fixture::new().await;
    let role = app_role(&f, "").await;
    let as_app = |epoch: i64| connect_as(&f, f.proxy.port(), &role, Some(epoch));
    let e1 = f.takeover("a").await;
    let app = as_app(e1).await;
    for _ in 0..3 {
        app.execute(WRITE, &[]).await.unwrap();
    }
    // REPEATABLE READ goes through the full guard.
    app.batch_execute(&format!("BEGIN ISOLATION LEVEL REPEATABLE READ; {WRITE}; COMMIT"))
        .await
        .unwrap();
    let e2 = f.takeover("b").await;
    assert_eq!(code(&app.execute(WRITE, &[]).await), "PF001");
    as_app(e2).await.execute(WRITE, &[]).await.unwrap();
    // What the guards may do, the role itself may not.
    assert_eq!(
        code(&app.batch_execute("UPDATE pgfence.fence SET hwm = hwm + 1").await),
        "42501"
    );
    // Control: straight to Postgres the same role's stale write lands.
    let direct = connect_as(&f, f.cluster.port(), &role, None).await;
    assert_eq!(direct.execute(WRITE, &[]).await.unwrap(), 1);
}

/// Without a lease the steady state runs inline with the caller's rights: an application
/// role still needs nothing beyond what `init` grants, on every path of the guard.
#[tokio::test]
async fn without_a_lease_an_application_role_needs_only_what_init_grants() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let role = app_role(&f, "").await;
    let as_app = |epoch: i64| connect_as(&f, f.proxy.port(), &role, Some(epoch));
    let app = as_app(3).await;
    // The bump, the read of the row, then the inline path, in both protocols.
    for _ in 0..3 {
        app.execute(WRITE, &[]).await.unwrap();
        app.batch_execute(WRITE).await.unwrap();
    }
    as_app(4).await.execute(WRITE, &[]).await.unwrap();
    assert_eq!(code(&app.execute(WRITE, &[]).await), "PF001");
    assert_eq!(code(&app.batch_execute(WRITE).await), "PF001");
    // The count is the installer's to raise: not by pgfence's own functions either.
    app.batch_execute("CREATE TEMP TABLE t (name text)").await.unwrap();
    for sql in [
        "SELECT pgfence.count_change()",
        "SELECT setval('pgfence.hwm_changes', 1)",
        "CREATE TRIGGER c AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION pgfence.fence_changed()",
    ] {
        assert_eq!(code(&app.batch_execute(sql).await), "42501", "{sql}");
    }
    // Control: straight to Postgres the same role's stale write lands.
    let direct = connect_as(&f, f.cluster.port(), &role, None).await;
    assert_eq!(direct.execute(WRITE, &[]).await.unwrap(), 1);
}

/// Counting a change of the HWM leaves the session's `lastval()` alone: after a new
/// leader's first write it is still the id the client's own INSERT drew, for a role with
/// no rights on pgfence's sequence too, and a session that drew none still has none.
#[tokio::test]
async fn counting_a_bump_leaves_lastval_to_the_client() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let role = app_role(
        &f,
        "GRANT SELECT, INSERT ON audit TO {role}; GRANT USAGE ON SEQUENCE audit_id_seq TO {role};",
    )
    .await;
    let insert_then_write = "BEGIN; INSERT INTO audit (note) VALUES ('a'); \
                             UPDATE sweep_state SET note = 'w' WHERE id = 1";
    for (epoch, port) in [(5, f.proxy.port()), (7, f.proxy.port()), (9, f.cluster.port())] {
        // Through pgfence each epoch's first write bumps the HWM; straight to Postgres the same.
        let c = connect_as(&f, port, &role, Some(epoch)).await;
        c.batch_execute(insert_then_write).await.unwrap();
        let (id, last): (i32, i64) = {
            let row = c.query_one("SELECT max(id), lastval() FROM audit", &[]).await.unwrap();
            (row.get(0), row.get(1))
        };
        assert_eq!(last, i64::from(id), "epoch {epoch}, port {port}");
        c.batch_execute("COMMIT").await.unwrap();
        let fresh = connect_as(&f, port, &role, Some(epoch + 1)).await;
        fresh.batch_execute(WRITE).await.unwrap();
        assert_eq!(code(&fresh.query_one("SELECT lastval()", &[]).await), "55000");
    }
    // A hand-made change counts in the changing session too, with the same care.
    let admin = &f.admin;
    admin
        .batch_execute("UPDATE pgfence.fence SET hwm = hwm + 1")
        .await
        .unwrap();
    assert_eq!(code(&admin.query_one("SELECT lastval()", &[]).await), "55000");
}

/// A read-only savepoint does not excuse a check: `RELEASE` of it puts the transaction back
/// to read-write, and a stale write after it is still refused. A write in a read-only
/// transaction fails with 25006, as it does straight to Postgres.
#[tokio::test]
async fn read_only_transactions_and_savepoints_are_checked_like_any_other() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let current = f.leader(3).await;
    for _ in 0..3 {
        current.execute(WRITE, &[]).await.unwrap();
    }
    let explain = "EXPLAIN (ANALYZE 00, COSTS off) UPDATE sweep_state SET note = 'x' WHERE id = 1";
    // One statement per Query, as drivers send them.
    async fn run(c: &tokio_postgres::Client, explain: &str, write: &str) -> Result<(), tokio_postgres::Error> {
        for sql in [
            "BEGIN",
            "SAVEPOINT s",
            "SET TRANSACTION READ ONLY",
            explain,
            "RELEASE s",
            write,
            "COMMIT",
        ] {
            c.batch_execute(sql).await?;
        }
        Ok(())
    }
    for c in [f.leader(3).await, current] {
        c.batch_execute("BEGIN READ ONLY").await.unwrap();
        assert_eq!(code(&c.execute(WRITE, &[]).await), "25006");
        c.batch_execute("ROLLBACK").await.unwrap();
    }
    let stale = f.leader(2).await;
    let stale_write = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";
    assert_eq!(code(&run(&stale, explain, stale_write).await), "PF001");
    stale.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(f.note().await.0, "w");
    // Control: straight to Postgres, the same script commits the stale write.
    let direct = f.direct().await;
    run(&direct, explain, stale_write).await.unwrap();
    assert_eq!(f.note().await.0, "stale");
}

/// Counting a change takes its lock only for the count: a takeover of one fence does not
/// wait for another fence's takeover to commit (it would, and could deadlock with the row
/// locks the two transactions take next, if the count's lock were held to commit).
#[tokio::test]
async fn bumps_of_two_fences_do_not_wait_for_each_other() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let (a, b) = (f.direct().await, f.direct().await);
    a.batch_execute("BEGIN; SELECT pgfence.guard('sweeper', 5, NULL, true)")
        .await
        .unwrap();
    let other = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        b.batch_execute("BEGIN; SELECT pgfence.guard('other', 5, NULL, true); COMMIT"),
    )
    .await;
    assert!(matches!(other, Ok(Ok(()))), "{other:?}");
    a.batch_execute("COMMIT").await.unwrap();
    let hwms: Vec<(String, i64)> = f
        .admin
        .query("SELECT name, hwm FROM pgfence.fence ORDER BY name", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(hwms, [("other".to_owned(), 5), ("sweeper".to_owned(), 5)]);
}

/// Calls of pgfence's PL/pgSQL guards (`guard_slow`, `guard_full`) that `client`'s session
/// made so far and has not reported yet (`track_functions = 'pl'` in that session): compare
/// two readings taken in one transaction.
async fn plpgsql_guard_calls(client: &tokio_postgres::Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'guard_slow'), 0)::bigint, \
                    coalesce(sum(calls) FILTER (WHERE funcname = 'guard_full'), 0)::bigint \
               FROM pg_stat_xact_user_functions WHERE schemaname = 'pgfence'",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// The PL/pgSQL guard calls one transaction of `client` made for `write`s, run through
/// pgfence (`Ok`), or the SQLSTATE the first one got.
async fn guard_calls_of(client: &tokio_postgres::Client, writes: usize) -> Result<(i64, i64), String> {
    client.batch_execute("BEGIN").await.unwrap();
    let before = plpgsql_guard_calls(client).await;
    for _ in 0..writes {
        let r = client.execute(WRITE, &[]).await;
        if r.is_err() {
            client.batch_execute("ROLLBACK").await.unwrap();
            return Err(code(&r));
        }
    }
    let after = plpgsql_guard_calls(client).await;
    client.batch_execute("COMMIT").await.unwrap();
    Ok((after.0 - before.0, after.1 - before.1))
}

/// Version 9: a fence with a lease has the same steady state, through the guard statement
/// pgfence prepares (which looks the lease trigger up itself). A session's first write at
/// the lease's epoch reads the fence row in `guard_slow` and records the count; its later
/// writes call no PL/pgSQL function. After a takeover the old session is refused by the
/// full guard, and the new leader goes through `guard_slow` once, then inline.
#[tokio::test]
async fn the_lease_steady_state_calls_no_plpgsql_function() {
    let f = Fixture::new().await;
    let one = f.takeover("a").await;
    let leader = f.leader(one).await;
    leader.batch_execute("SET track_functions = 'pl'").await.unwrap();
    assert_eq!(
        guard_calls_of(&leader, 1).await,
        Ok((1, 0)),
        "the first write reads the row"
    );
    for _ in 0..3 {
        assert_eq!(guard_calls_of(&leader, 1).await, Ok((0, 0)), "steady state");
    }
    // The simple protocol runs the same statement.
    leader.batch_execute(&format!("BEGIN; {WRITE}; COMMIT")).await.unwrap();
    assert_eq!(guard_calls_of(&leader, 2).await, Ok((0, 0)));

    // A marker set by hand for a stale epoch, without the count, changes nothing.
    let two = f.takeover("b").await;
    leader
        .execute(
            "SELECT set_config('pgfence.lease_passed', pgfence.lease_marker('sweeper', $1, 'public.leader_lease', true), false)",
            &[&one],
        )
        .await
        .unwrap();
    assert_eq!(guard_calls_of(&leader, 1).await, Err("PF001".to_owned()));

    let new = f.leader(two).await;
    new.batch_execute("SET track_functions = 'pl'").await.unwrap();
    assert_eq!(guard_calls_of(&new, 1).await, Ok((1, 0)));
    assert_eq!(guard_calls_of(&new, 2).await, Ok((0, 0)));
    // Control: straight to Postgres the stale session's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// Version 9 counts every change to a fence row's lease columns, not only to its HWM: the
/// steady state notices a lease row deleted, renamed away or truncated (the lease then
/// grants nothing: PF003), which leave the HWM where it was, and a takeover (PF001). Each
/// time the session had passed twice at the lease's epoch; once the row is back, it grants
/// a new epoch, and the old one stays refused.
#[tokio::test]
async fn every_change_of_the_lease_is_noticed_after_the_short_path_ran() {
    let f = Fixture::new().await;
    let mut epoch = f.takeover("a").await;
    let changes = [
        ("DELETE FROM leader_lease WHERE name = 'sweeper'", "PF003"),
        (
            "UPDATE leader_lease SET name = 'elsewhere' WHERE name = 'sweeper'",
            "PF003",
        ),
        ("TRUNCATE leader_lease", "PF003"),
        ("", "PF001"), // a takeover
    ];
    for (change, expected) in changes {
        let leader = f.leader(epoch).await;
        leader.execute(WRITE, &[]).await.unwrap(); // reads the row, records the count
        leader.execute(WRITE, &[]).await.unwrap(); // steady state
        if change.is_empty() {
            epoch = f.takeover("b").await;
        } else {
            f.admin.batch_execute(change).await.unwrap();
            assert_eq!(f.hwm().await, epoch, "{change} leaves the HWM");
        }
        assert_eq!(code(&leader.execute(WRITE, &[]).await), expected, "after {change:?}");
        assert_eq!(code(&leader.batch_execute(WRITE).await), expected, "after {change:?}");
        // The lease row back: after a revocation it grants a new epoch (version 11), and
        // the cut-off leader stays cut off.
        f.admin
            .batch_execute(
                "DELETE FROM leader_lease WHERE name = 'elsewhere'; \
                 INSERT INTO leader_lease (name) VALUES ('sweeper') ON CONFLICT DO NOTHING",
            )
            .await
            .unwrap();
        if !change.is_empty() {
            let granted: i64 = f
                .admin
                .query_one("SELECT epoch FROM leader_lease WHERE name = 'sweeper'", &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(granted, epoch + 1, "after {change:?}");
            assert_eq!(code(&leader.execute(WRITE, &[]).await), "PF001", "after {change:?}");
            epoch = granted;
        }
    }
    // Control: straight to Postgres the stale epoch's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// `init` enables the lease triggers ALWAYS, so they also fire under
/// `session_replication_role = replica` (a logical replication worker's, or a superuser's),
/// where the fence row's own triggers do not: the lease functions count a takeover and a
/// revocation themselves, so the steady state still sees them.
#[tokio::test]
async fn lease_changes_where_fence_triggers_do_not_fire_are_noticed() {
    let f = Fixture::new().await;
    let enabled: Vec<String> = f
        .admin
        .query(
            "SELECT tgname || ' ' || tgenabled::text FROM pg_trigger \
              WHERE tgrelid = 'leader_lease'::regclass AND NOT tgisinternal ORDER BY tgname",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(enabled, ["pgfence_lease A", "pgfence_lease_truncate A"]);
    let as_replica = |sql: &'static str| {
        let admin = &f.admin;
        async move {
            admin
                .batch_execute(&format!(
                    "SET session_replication_role = replica; {sql}; RESET session_replication_role"
                ))
                .await
                .unwrap();
        }
    };
    let one = f.takeover("a").await;
    let leader = f.leader(one).await;
    leader.execute(WRITE, &[]).await.unwrap(); // reads the row, records the count
    leader.execute(WRITE, &[]).await.unwrap(); // steady state
    as_replica("UPDATE leader_lease SET holder = 'b', epoch = epoch + 1 WHERE name = 'sweeper'").await;
    assert_eq!(f.hwm().await, one + 1, "the lease trigger fired");
    assert_eq!(code(&leader.execute(WRITE, &[]).await), "PF001");
    let two = f.leader(one + 1).await;
    two.execute(WRITE, &[]).await.unwrap();
    two.execute(WRITE, &[]).await.unwrap();
    as_replica("DELETE FROM leader_lease WHERE name = 'sweeper'").await;
    assert_eq!(code(&two.execute(WRITE, &[]).await), "PF003");
    // Control: straight to Postgres the stale epoch's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// The guards that run with the installer's rights and no `search_path` of their own name
/// every type with its schema. A role's temporary domain named `text`, whose CHECK calls the
/// role's function, would otherwise be what a PL/pgSQL variable declared `text` gets, and
/// the CHECK would run as the installer when the function starts.
#[tokio::test]
async fn a_temporary_type_named_text_runs_nothing_as_the_installer() {
    let f = Fixture::new().await;
    let role = app_role(&f, "").await;
    let e = f.takeover("a").await;
    let app = connect_as(&f, f.cluster.port(), &role, None).await;
    app.batch_execute(
        "CREATE FUNCTION pg_temp.spy(pg_catalog.text) RETURNS pg_catalog.bool LANGUAGE sql AS \
           $$ SELECT pg_catalog.set_config('spy.ran_as', \
                  coalesce(pg_catalog.current_setting('spy.ran_as', true), '') OPERATOR(pg_catalog.||) \
                  ' ' OPERATOR(pg_catalog.||) current_user::pg_catalog.text, false) IS NOT NULL $$; \
         CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (pg_temp.spy(VALUE))",
    )
    .await
    .unwrap();
    let ran_as = || async {
        app.query_one("SELECT coalesce(current_setting('spy.ran_as', true), '')", &[])
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    for call in [
        format!("SELECT pgfence.guard_slow('sweeper', {e}, 'public.leader_lease', true)"),
        format!("SELECT pgfence.guard('sweeper', {e}, 'public.leader_lease', true)"),
        format!("SELECT pgfence.guard_lease('sweeper', {e}, 'public.leader_lease', true, true)"),
        format!("SELECT pgfence.guard_lease('sweeper', {e}, 'public.leader_lease', true, false)"),
        format!("SELECT pgfence.guard_full('sweeper', {e}, 'public.leader_lease', true)"),
    ] {
        for _ in 0..2 {
            app.batch_execute(&call).await.unwrap();
        }
        assert_eq!(ran_as().await, "", "{call}");
    }
    // Control: the domain's CHECK does run where the type is looked up by the role's path.
    app.batch_execute("DO $$ DECLARE v text := 'x'; BEGIN END $$")
        .await
        .unwrap();
    assert_eq!(ran_as().await.trim(), role);
}

/// Version 9: a revocation (the lease row deleted) takes the fence's lock exclusive, as a
/// takeover does: it waits for the writer past the guard's steady state, and once it
/// commits that writer's next write is refused.
#[tokio::test]
async fn a_revocation_waits_for_writers_past_the_short_path() {
    let f = Fixture::new().await;
    let epoch = f.takeover("a").await;
    let leader = f.leader(epoch).await;
    leader.execute(WRITE, &[]).await.unwrap();
    leader.execute(WRITE, &[]).await.unwrap();
    leader.batch_execute(&format!("BEGIN; {WRITE}")).await.unwrap();
    let admin = f.direct().await;
    let revoke = tokio::spawn(async move {
        admin
            .batch_execute("DELETE FROM leader_lease WHERE name = 'sweeper'")
            .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !revoke.is_finished(),
        "the revocation waits for the writer past the guard"
    );
    leader.batch_execute(&format!("{WRITE}; COMMIT")).await.unwrap();
    revoke.await.unwrap().unwrap();
    assert_eq!(code(&leader.execute(WRITE, &[]).await), "PF003");
    assert_eq!(code(&leader.batch_execute(WRITE).await), "PF003");
    // Control: straight to Postgres the same write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}
