//! The high-water mark never goes down: not across proxy restarts, Postgres
//! restarts, several proxies, or a re-created lease row.

use super::{Fixture, NO_LEASE, SEED_SQL, code, fence_toml, install};
use crate::common::inproc::Proxy;
use crate::common::pg::{Cluster, connect};

const WRITE: &str = "UPDATE sweep_state SET note = 'w' WHERE id = 1";

/// Without a lease, the first write with a higher epoch raises the HWM.

#[tokio::test]
async fn hwm_survives_proxy_restart_and_is_shared_by_two_proxies() {
    let cluster = Cluster::shared();
    let f = Fixture::with(cluster, NO_LEASE).await;
    let second = Proxy::start(cluster.port(), NO_LEASE).await;
    f.leader(1).await.execute(WRITE, &[]).await.unwrap();
    connect(second.port(), &f.db, "-c pgfence.epoch=3")
        .await
        .execute(WRITE, &[])
        .await
        .unwrap();
    assert_eq!(f.hwm().await, 3);
    assert_eq!(
        code(&f.leader(2).await.execute(WRITE, &[]).await),
        "PF001",
        "other proxy's HWM applies"
    );
    drop(second);
    let restarted = Proxy::start(cluster.port(), NO_LEASE).await;
    let s = connect(restarted.port(), &f.db, "-c pgfence.epoch=2").await;
    assert_eq!(
        code(&s.execute(WRITE, &[]).await),
        "PF001",
        "HWM survives a proxy restart"
    );
    connect(restarted.port(), &f.db, "-c pgfence.epoch=3")
        .await
        .execute(WRITE, &[])
        .await
        .unwrap();
}

#[tokio::test]
async fn hwm_survives_an_immediate_postgres_restart() {
    let cluster: &'static Cluster = Box::leak(Box::new(Cluster::start()));
    let db = cluster.fresh_db().await;
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install(&mut admin, cluster.port(), NO_LEASE).await;
    let proxy = Proxy::start(cluster.port(), NO_LEASE).await;
    connect(proxy.port(), &db, "-c pgfence.epoch=5")
        .await
        .execute(WRITE, &[])
        .await
        .unwrap();
    cluster.restart_immediate();
    let s = connect(proxy.port(), &db, "-c pgfence.epoch=4").await;
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
    let admin = cluster.admin(&db).await;
    let hwm: i64 = admin
        .query_one("SELECT hwm FROM pgfence.fence", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(hwm, 5);
}

#[tokio::test]
async fn recreated_lease_row_does_not_start_below_the_hwm() {
    let f = Fixture::new().await;
    f.takeover("a").await;
    let e2 = f.takeover("b").await;
    f.leader(e2).await.execute(WRITE, &[]).await.unwrap();
    f.admin
        .batch_execute("DELETE FROM leader_lease; INSERT INTO leader_lease (name) VALUES ('sweeper')")
        .await
        .unwrap();
    assert_eq!(lease_row_epoch(&f).await, e2 + 1, "a re-created row starts a new epoch");
    let e3 = f.takeover("c").await;
    assert!(e3 > e2 + 1, "a new leader is never born stale");
    assert_eq!(code(&f.leader(e2).await.execute(WRITE, &[]).await), "PF001");
    f.leader(e3).await.execute(WRITE, &[]).await.unwrap();
    // Lowering the lease epoch is refused.
    let r = f.admin.execute("UPDATE leader_lease SET epoch = 1", &[]).await;
    assert!(r.is_err(), "lowering the lease epoch must fail");
    assert!(f.hwm().await >= e3);
}

/// The epoch the lease row grants.
async fn lease_row_epoch(f: &Fixture) -> i64 {
    f.admin
        .query_one("SELECT epoch FROM leader_lease WHERE name = 'sweeper'", &[])
        .await
        .unwrap()
        .get(0)
}

/// Long enough for a statement sent in the background to reach the lock it waits for.
async fn settle() {
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
}

/// Runs `sql` straight against Postgres on a connection of its own, in the background.
fn spawn_direct(f: &Fixture, sql: &'static str) -> tokio::task::JoinHandle<Result<(), tokio_postgres::Error>> {
    let (db, port) = (f.db.clone(), f.cluster.port());
    tokio::spawn(async move { connect(port, &db, "").await.batch_execute(sql).await })
}

/// After a revocation (the row deleted, renamed away, the table truncated) a lease row that
/// grants the fence again starts a new epoch above the HWM, whatever it asked for (the
/// table's default 0, the revoked epoch itself): the leader that was cut off stays cut off,
/// also when it had passed the guard's steady state (schema version 11). An upsert that
/// meets the live row moves nothing, although the BEFORE INSERT trigger fires for it.
#[tokio::test]
async fn a_lease_row_granted_again_after_a_revocation_starts_a_new_epoch() {
    let f = Fixture::new().await;
    let mut epoch = f.takeover("a").await;
    let regrants = [
        "DELETE FROM leader_lease; INSERT INTO leader_lease (name) VALUES ('sweeper')",
        "DELETE FROM leader_lease; \
         INSERT INTO leader_lease (name, holder, epoch) VALUES ('sweeper', 'b', {epoch})",
        "UPDATE leader_lease SET name = 'elsewhere'; UPDATE leader_lease SET name = 'sweeper'",
        "TRUNCATE leader_lease; INSERT INTO leader_lease (name, epoch) VALUES ('sweeper', {epoch}) \
         ON CONFLICT (name) DO UPDATE SET epoch = leader_lease.epoch + 1",
    ];
    for regrant in regrants {
        let regrant = regrant.replace("{epoch}", &epoch.to_string());
        let old = f.leader(epoch).await;
        old.execute(WRITE, &[]).await.unwrap();
        old.execute(WRITE, &[]).await.unwrap(); // the steady state
        f.admin.batch_execute(&regrant).await.unwrap();
        let granted = lease_row_epoch(&f).await;
        assert_eq!(granted, epoch + 1, "{regrant}");
        assert_eq!(f.hwm().await, epoch + 1, "{regrant}");
        assert_eq!(code(&old.execute(WRITE, &[]).await), "PF001", "{regrant}");
        assert_eq!(code(&old.batch_execute(WRITE).await), "PF001", "{regrant}");
        f.leader(granted).await.execute(WRITE, &[]).await.unwrap();
        epoch = granted;
    }
    let leader = f.leader(epoch).await;
    leader.execute(WRITE, &[]).await.unwrap();
    f.admin
        .batch_execute(&format!(
            "INSERT INTO leader_lease (name) VALUES ('sweeper') ON CONFLICT DO NOTHING; \
             INSERT INTO leader_lease (name, epoch) VALUES ('sweeper', {above}) ON CONFLICT DO NOTHING; \
             INSERT INTO leader_lease (name, epoch) VALUES ('sweeper', {above}) \
               ON CONFLICT (name) DO UPDATE SET holder = 'renewed'",
            above = epoch + 10
        ))
        .await
        .unwrap();
    assert_eq!((lease_row_epoch(&f).await, f.hwm().await), (epoch, epoch));
    // EXCLUDED is the row as inserted, not lifted: taking its epoch lowers the row.
    let r = f
        .admin
        .batch_execute(
            "INSERT INTO leader_lease (name, holder) VALUES ('sweeper', 'x') \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = excluded.epoch",
        )
        .await;
    assert_eq!(code(&r), "PF001");
    leader.execute(WRITE, &[]).await.unwrap();
    // Control: straight to Postgres the cut-off leader's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// Lease changes that race are decided under the fence's lock: a row inserted while a
/// revocation is in progress waits for it and then grants a new epoch (it neither takes the
/// cut-off leader's epoch back nor lands beside a revoked fence); an insert that meets a row
/// inserted by a transaction still open waits for it and changes nothing; two acquisitions
/// by upsert while a writer is past the guard both finish, one taking over, with no
/// deadlock; an upsert that meets a row a release is about to delete grants once it
/// inserts; and under REPEATABLE READ a row gone since the snapshot is a serialization
/// failure.
#[tokio::test]
async fn lease_changes_that_race_are_decided_under_the_fence_lock() {
    let f = Fixture::new().await;
    let epoch = f.takeover("a").await;
    let old = f.leader(epoch).await;
    old.execute(WRITE, &[]).await.unwrap();
    let lease = || async {
        let row = f
            .admin
            .query_one(
                "SELECT l.epoch, f.hwm, f.lease_epoch FROM leader_lease l, pgfence.fence f \
                  WHERE l.name = 'sweeper' AND f.name = 'sweeper'",
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2))
    };
    let spawn = |sql: &'static str| spawn_direct(&f, sql);

    // A revocation in progress; two inserts of the row meanwhile.
    let revoker = f.direct().await;
    revoker
        .batch_execute("BEGIN; DELETE FROM leader_lease WHERE name = 'sweeper'")
        .await
        .unwrap();
    let first = spawn("INSERT INTO leader_lease (name, holder) VALUES ('sweeper', 'b') ON CONFLICT DO NOTHING");
    let second = spawn(
        "INSERT INTO leader_lease (name, holder) VALUES ('sweeper', 'c') \
         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder",
    );
    settle().await;
    assert!(!first.is_finished() && !second.is_finished(), "the inserts wait");
    revoker.batch_execute("COMMIT").await.unwrap();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(lease().await, (epoch + 1, epoch + 1, epoch + 1));
    assert_eq!(code(&old.execute(WRITE, &[]).await), "PF001");
    let new = f.leader(epoch + 1).await;
    new.execute(WRITE, &[]).await.unwrap();

    // An insert of the row by a transaction still open, after a revocation; another insert.
    f.admin.batch_execute("DELETE FROM leader_lease").await.unwrap();
    let inserter = f.direct().await;
    inserter
        .batch_execute(&format!(
            "BEGIN; INSERT INTO leader_lease (name, holder, epoch) VALUES ('sweeper', 'd', {})",
            epoch + 5
        ))
        .await
        .unwrap();
    let other = spawn("INSERT INTO leader_lease (name, holder) VALUES ('sweeper', 'e') ON CONFLICT DO NOTHING");
    settle().await;
    assert!(!other.is_finished(), "the second insert waits for the first");
    inserter.batch_execute("COMMIT").await.unwrap();
    other.await.unwrap().unwrap();
    assert_eq!(lease().await, (epoch + 5, epoch + 5, epoch + 5));
    let holder = f.leader(epoch + 5).await;
    holder.execute(WRITE, &[]).await.unwrap();

    // Two acquisitions by upsert while the holder's transaction is past the guard.
    holder.batch_execute(&format!("BEGIN; {WRITE}")).await.unwrap();
    f.admin
        .batch_execute("UPDATE leader_lease SET expires_at = '-infinity'")
        .await
        .unwrap();
    let acquire = "INSERT INTO leader_lease (name, holder, epoch, expires_at) \
                   VALUES ('sweeper', 'f', 1, now() + interval '30 s') \
                   ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leader_lease.epoch + 1, \
                     expires_at = excluded.expires_at WHERE leader_lease.expires_at < now()";
    let (one, two) = (spawn(acquire), spawn(acquire));
    settle().await;
    assert!(
        !one.is_finished() && !two.is_finished(),
        "the takeover waits for the writer"
    );
    holder.batch_execute(&format!("{WRITE}; COMMIT")).await.unwrap();
    one.await.unwrap().unwrap();
    two.await.unwrap().unwrap();
    assert_eq!(lease().await, (epoch + 6, epoch + 6, epoch + 6));
    assert_eq!(code(&holder.execute(WRITE, &[]).await), "PF001");

    // An acquisition by upsert that meets the row while a release waits for it: the release
    // goes first, and the upsert, which then inserts, grants a new epoch (Postgres does not
    // fire the row trigger again when the conflict it waited for goes away).
    let locker = f.direct().await;
    locker
        .batch_execute("BEGIN; SELECT FROM leader_lease WHERE name = 'sweeper' FOR UPDATE")
        .await
        .unwrap();
    let release = spawn("DELETE FROM leader_lease WHERE name = 'sweeper'");
    settle().await;
    let late = spawn(acquire);
    settle().await;
    assert!(!release.is_finished() && !late.is_finished(), "both wait for the row");
    locker.batch_execute("COMMIT").await.unwrap();
    release.await.unwrap().unwrap();
    late.await.unwrap().unwrap();
    assert_eq!(lease().await, (epoch + 7, epoch + 7, epoch + 7));

    // Under REPEATABLE READ an insert of a row that went since the snapshot is a
    // serialization failure, and leaves the lease revoked.
    let rr = f.direct().await;
    rr.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM sweep_state")
        .await
        .unwrap();
    f.admin.batch_execute("DELETE FROM leader_lease").await.unwrap();
    let r = rr
        .batch_execute("INSERT INTO leader_lease (name, holder) VALUES ('sweeper', 'g')")
        .await;
    assert_eq!(code(&r), "40001");
    rr.batch_execute("ROLLBACK").await.unwrap();
    let revoked: (i64, i64, i64) = f
        .admin
        .query_one(
            "SELECT (SELECT count(*) FROM leader_lease), hwm, lease_epoch FROM pgfence.fence",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    assert_eq!(revoked, (0, epoch + 7, 0));
    // Control: straight to Postgres the cut-off leaders' writes land.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// An acquisition by upsert that waited for another insert of the lease row, and then meets
/// that row, holds none of the fence's locks while it waits for the row in DO UPDATE: a
/// takeover that holds the row and waits for the fence's lock (behind a writer past the
/// guard) does not deadlock with it. Both take over, one after the other.
#[tokio::test]
async fn an_upsert_meeting_a_new_row_holds_no_fence_lock() {
    let f = Fixture::new().await;
    let epoch = f.takeover("a").await;
    f.admin.batch_execute("DELETE FROM leader_lease").await.unwrap();
    let spawn = |sql: &'static str| spawn_direct(&f, sql);
    let inserter = f.direct().await;
    inserter
        .batch_execute("BEGIN; INSERT INTO leader_lease (name, holder) VALUES ('sweeper', 'x')")
        .await
        .unwrap();
    let writer = f.leader(epoch + 1).await;
    let writer = tokio::spawn(async move {
        writer.batch_execute(&format!("BEGIN; {WRITE}")).await.unwrap();
        writer
    });
    let upsert = spawn(
        "INSERT INTO leader_lease (name, holder) VALUES ('sweeper', 'y') \
         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leader_lease.epoch + 1 \
         WHERE leader_lease.expires_at < now()",
    );
    settle().await;
    inserter.batch_execute("COMMIT").await.unwrap();
    let writer = writer.await.unwrap(); // past the guard at the inserted row's epoch
    settle().await;
    let takeover = spawn("UPDATE leader_lease SET holder = 'z', epoch = epoch + 1 WHERE name = 'sweeper'");
    settle().await;
    assert!(
        !upsert.is_finished() && !takeover.is_finished(),
        "both wait for the writer"
    );
    writer.batch_execute("COMMIT").await.unwrap();
    upsert.await.unwrap().unwrap();
    takeover.await.unwrap().unwrap();
    assert_eq!(lease_row_epoch(&f).await, epoch + 3);
    assert_eq!(f.hwm().await, epoch + 3);
}

/// Two fences share one lease row; the second one `init` registers is at a higher mark, so
/// the row is lifted for both: the report gives both fences their values after the install,
/// not the first fence's from before the lift.
#[tokio::test]
async fn init_reports_fences_sharing_a_lease_row_as_they_end() {
    use pgfence::fence::install::{FenceStatus, LeaseStatus};
    let mut f = Fixture::new().await;
    let epoch = f.takeover("a").await;
    f.admin
        .batch_execute("SELECT pgfence.guard('beta', 7, NULL, true)")
        .await
        .unwrap();
    let toml = format!(
        "upstream = \"127.0.0.1:{}\"\n{}[[fence]]\nname = \"beta\"\ntables = [\"audit\"]\n\
         [fence.lease]\ntable = \"public.leader_lease\"\nrow = \"sweeper\"\n",
        f.cluster.port(),
        fence_toml()
    );
    let config = pgfence::config::RawConfig::from_toml(&toml)
        .unwrap()
        .validate()
        .unwrap();
    let report = pgfence::fence::install::install(&mut f.admin, &config.fences)
        .await
        .unwrap();
    let ends: Vec<(String, i64, i64)> = report
        .fences
        .iter()
        .map(|r| match &r.status {
            FenceStatus::Registered {
                hwm,
                lease: LeaseStatus::Installed { lease_epoch, .. },
                ..
            } => (r.fence.clone(), *hwm, *lease_epoch),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(epoch < 7);
    assert_eq!(ends, [("sweeper".to_owned(), 8, 8), ("beta".to_owned(), 8, 8)]);
    assert_eq!(lease_row_epoch(&f).await, 8);
}

/// A fence revoked at the largest epoch cannot be granted again (there is no epoch above
/// it): the insert fails with PF003 and a message that says so, and nothing changes.
#[tokio::test]
async fn a_fence_revoked_at_the_largest_epoch_is_not_granted_again() {
    let f = Fixture::new().await;
    f.admin
        .batch_execute(&format!(
            "UPDATE leader_lease SET epoch = {max} WHERE name = 'sweeper'; DELETE FROM leader_lease",
            max = i64::MAX
        ))
        .await
        .unwrap();
    let e = f
        .admin
        .batch_execute("INSERT INTO leader_lease (name) VALUES ('sweeper')")
        .await
        .expect_err("no epoch above the largest");
    let db = e.as_db_error().expect("raised by Postgres");
    assert_eq!(db.code().code(), "PF003");
    assert_eq!(
        db.message(),
        format!(
            "pgfence: lease row \"sweeper\" in public.leader_lease cannot grant fence \"sweeper\" \
             a new epoch: the fence is at the largest epoch, {}",
            i64::MAX
        )
    );
    assert_eq!(f.hwm().await, i64::MAX);
    let rows: i64 = f
        .admin
        .query_one("SELECT count(*) FROM leader_lease", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    assert_eq!(code(&f.leader(i64::MAX).await.execute(WRITE, &[]).await), "PF003");
}

/// `init` finds a lease row that the trigger did not see start below the fence's epoch (the
/// lease table dropped and created again, with a row at epoch 1) and starts a new epoch:
/// the last leader, whose grant went with the old table, stays cut off.
#[tokio::test]
async fn init_starts_a_new_epoch_for_a_stale_lease_row() {
    let mut f = Fixture::new().await;
    f.takeover("a").await;
    let epoch = f.takeover("b").await;
    let old = f.leader(epoch).await;
    old.execute(WRITE, &[]).await.unwrap();
    f.admin
        .batch_execute(
            "DROP TABLE leader_lease; \
             CREATE TABLE leader_lease (name text PRIMARY KEY, holder text, \
               epoch bigint NOT NULL DEFAULT 0, expires_at timestamptz NOT NULL DEFAULT '-infinity'); \
             INSERT INTO leader_lease VALUES ('sweeper', 'c', 1, now() + interval '30 s')",
        )
        .await
        .unwrap();
    assert_eq!(code(&old.execute(WRITE, &[]).await), "PF005", "no trigger");
    install(&mut f.admin, f.cluster.port(), &fence_toml()).await;
    assert_eq!((lease_row_epoch(&f).await, f.hwm().await), (epoch + 1, epoch + 1));
    assert_eq!(code(&old.execute(WRITE, &[]).await), "PF001");
    assert_eq!(code(&old.batch_execute(WRITE).await), "PF001");
    f.leader(epoch + 1).await.execute(WRITE, &[]).await.unwrap();
    // Control: straight to Postgres the cut-off leader's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

#[tokio::test]
async fn init_is_idempotent_and_keeps_the_hwm() {
    let mut f = Fixture::new().await;
    let e1 = f.takeover("a").await;
    f.leader(e1).await.execute(WRITE, &[]).await.unwrap();
    install(&mut f.admin, f.cluster.port(), &fence_toml()).await;
    install(&mut f.admin, f.cluster.port(), &fence_toml()).await;
    assert_eq!(f.hwm().await, e1);
    f.leader(e1).await.execute(WRITE, &[]).await.unwrap();
}

/// The migrations an older pgfence knew, in order (name, text).
const OLD_MIGRATIONS: [(&str, &str); 6] = [
    ("0001_init", include_str!("../../../src/fence/sql/0001_init.sql")),
    (
        "0002_fast_guard",
        include_str!("../../../src/fence/sql/0002_fast_guard.sql"),
    ),
    (
        "0003_guard_locks",
        include_str!("../../../src/fence/sql/0003_guard_locks.sql"),
    ),
    (
        "0004_current_epoch",
        include_str!("../../../src/fence/sql/0004_current_epoch.sql"),
    ),
    (
        "0005_hwm_changes",
        include_str!("../../../src/fence/sql/0005_hwm_changes.sql"),
    ),
    (
        "0006_inline_guard",
        include_str!("../../../src/fence/sql/0006_inline_guard.sql"),
    ),
];

/// What the install of a pgfence that knew schema versions 1 to `version` did: the
/// bootstrap, those migrations and their version rows, then `extra`, in one transaction.
async fn install_old_schema(admin: &tokio_postgres::Client, version: usize, extra: &str) {
    let mut sql = String::from(
        "BEGIN; CREATE SCHEMA pgfence;
         CREATE TABLE pgfence.schema_version (version integer PRIMARY KEY, name text NOT NULL,
           applied_at timestamptz NOT NULL DEFAULT now());",
    );
    for (i, (name, text)) in OLD_MIGRATIONS[..version].iter().enumerate() {
        sql.push_str(text);
        sql.push_str(&format!(
            "\nINSERT INTO pgfence.schema_version (version, name) VALUES ({}, '{name}');\n",
            i + 1
        ));
    }
    sql.push_str(extra);
    sql.push_str("; COMMIT");
    admin.batch_execute(&sql).await.unwrap();
}

/// The schema version `init` left.
async fn installed_version(admin: &tokio_postgres::Client) -> i32 {
    admin
        .query_one("SELECT max(version) FROM pgfence.schema_version", &[])
        .await
        .unwrap()
        .get(0)
}

/// A database initialised by a pgfence that knew only schema version 1 is upgraded in
/// place: its fences, HWM and lease trigger stay, and the new guard takes over.
#[tokio::test]
async fn init_upgrades_a_version_1_schema_and_keeps_the_hwm() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install_old_schema(&admin, 1, "INSERT INTO pgfence.fence (name, hwm) VALUES ('sweeper', 6)").await;
    install(&mut admin, cluster.port(), NO_LEASE).await;
    assert_eq!(installed_version(&admin).await, pgfence::fence::install::SCHEMA_VERSION);
    let proxy = Proxy::start(cluster.port(), NO_LEASE).await;
    let s = connect(proxy.port(), &db, "-c pgfence.epoch=5").await;
    assert_eq!(
        code(&s.execute(WRITE, &[]).await),
        "PF001",
        "the HWM of version 1 holds"
    );
    connect(proxy.port(), &db, "-c pgfence.epoch=7")
        .await
        .execute(WRITE, &[])
        .await
        .unwrap();
    let hwm: i64 = admin
        .query_one("SELECT hwm FROM pgfence.fence WHERE name = 'sweeper'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(hwm, 7);
    // Control: straight to Postgres the stale epoch's write lands.
    assert_eq!(write_directly(cluster, &db).await, 1);
}

/// An upgrade from schema version 5 under live sessions: statements they prepared before
/// it and the counts they recorded carry over, and a takeover after it still refuses the
/// old epoch in both protocols.
#[tokio::test]
async fn init_upgrades_a_version_5_schema_under_live_sessions() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install_old_schema(&admin, 5, "").await;
    let proxy = Proxy::start(cluster.port(), NO_LEASE).await;
    let old = connect(proxy.port(), &db, "-c pgfence.epoch=5").await;
    // The bump, the read of the row, then the count: every path of version 5's guard.
    for _ in 0..3 {
        old.execute(WRITE, &[]).await.unwrap();
        old.batch_execute(WRITE).await.unwrap();
    }
    install(&mut admin, cluster.port(), NO_LEASE).await;
    assert_eq!(installed_version(&admin).await, pgfence::fence::install::SCHEMA_VERSION);
    for _ in 0..3 {
        old.execute(WRITE, &[]).await.unwrap();
        old.batch_execute(WRITE).await.unwrap();
    }
    connect(proxy.port(), &db, "-c pgfence.epoch=6")
        .await
        .execute(WRITE, &[])
        .await
        .unwrap();
    assert_eq!(code(&old.execute(WRITE, &[]).await), "PF001");
    assert_eq!(code(&old.batch_execute(WRITE).await), "PF001");
    // Control: straight to Postgres the stale epoch's write lands.
    assert_eq!(write_directly(cluster, &db).await, 1);
}

/// A database whose schema is older than this pgfence (version 6 has no refusal that gives
/// the current epoch): the guard still works, and a refusal pgfence decides says that
/// `pgfence init` is due (PF005) rather than failing with Postgres' own error. After the
/// upgrade it is the PF002 it was, with the fence's current epoch.
#[tokio::test]
async fn a_version_6_schema_asks_for_init_where_it_lacks_a_function() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install_old_schema(&admin, 6, "").await;
    let proxy = Proxy::start(cluster.port(), NO_LEASE).await;
    connect(proxy.port(), &db, "-c pgfence.epoch=4")
        .await
        .execute(WRITE, &[])
        .await
        .unwrap();
    let none = connect(proxy.port(), &db, "").await;
    for r in [
        none.execute(WRITE, &[]).await.map(drop),
        none.batch_execute(WRITE).await,
    ] {
        assert_eq!(code(&r), "PF005");
        let e = r.unwrap_err();
        let message = e.as_db_error().unwrap().message();
        assert_eq!(
            message,
            "pgfence: the database's pgfence schema is older than this pgfence; writes to fence \"sweeper\" \
             are refused"
        );
    }
    install(&mut admin, cluster.port(), NO_LEASE).await;
    let r = none.execute(WRITE, &[]).await;
    assert_eq!(code(&r), "PF002");
    let e = r.unwrap_err();
    assert_eq!(
        e.as_db_error().unwrap().message(),
        "pgfence: write to fence \"sweeper\" without an epoch (current epoch 4)"
    );
}

/// A schema dropped and installed again does not count changes from where a live session
/// recorded its count: after a takeover on the new schema, that session's stale write is
/// refused (the new count starts at the install's time in microseconds).
#[tokio::test]
async fn a_reinstalled_schema_does_not_repeat_a_recorded_count() {
    let mut f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let old = f.leader(5).await;
    for _ in 0..3 {
        old.execute(WRITE, &[]).await.unwrap();
        old.batch_execute(WRITE).await.unwrap();
    }
    f.admin.batch_execute("DROP SCHEMA pgfence CASCADE").await.unwrap();
    install(&mut f.admin, f.cluster.port(), NO_LEASE).await;
    f.leader(6).await.execute(WRITE, &[]).await.unwrap();
    assert_eq!(code(&old.execute(WRITE, &[]).await), "PF001");
    assert_eq!(code(&old.batch_execute(WRITE).await), "PF001");
    // Control: straight to Postgres the stale epoch's write lands.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// A database whose encoding is LATIN1: `pgfence init` and every call pgfence sends convert
/// to it (they are ASCII), and the guard and pgfence's own refusals keep their SQLSTATEs.
#[tokio::test]
async fn init_and_the_guard_work_in_a_latin1_database() {
    use super::take_lease;
    let cluster = Cluster::shared();
    let name = "it_latin1";
    let postgres = cluster.admin("postgres").await;
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"),
    ] {
        postgres.batch_execute(&sql).await.unwrap();
    }
    let mut admin = cluster.admin(name).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install(&mut admin, cluster.port(), &fence_toml()).await;
    let proxy = Proxy::start(cluster.port(), &fence_toml()).await;
    take_lease(&admin, "a").await;
    let current = take_lease(&admin, "b").await;
    let port = proxy.port();
    let write = |options: String| async move {
        let s = connect(port, name, &options).await;
        code(&s.execute(WRITE, &[]).await)
    };
    assert_eq!(write(format!("-c pgfence.epoch={current}")).await, "ok");
    assert_eq!(write(format!("-c pgfence.epoch={}", current - 1)).await, "PF001");
    assert_eq!(write(String::new()).await, "PF002");
    // A rewrite-style refusal's hint went through pgfence's own message (ASCII as well).
    let s = connect(proxy.port(), name, &format!("-c pgfence.epoch={current}")).await;
    let r = s.batch_execute("DO 'begin update sweep_state set note = 1; end'").await;
    assert_eq!(code(&r), "PF004");
}

/// Runs [`WRITE`] straight against Postgres, as the controls do; returns the rows written.
async fn write_directly(cluster: &Cluster, db: &str) -> u64 {
    connect(cluster.port(), db, "").await.execute(WRITE, &[]).await.unwrap()
}

/// Every role may call the guard (pgfence's sessions run it as the application's role), so a
/// direct call must stay within what the fence allows: a role with no rights at all, calling
/// it without naming the lease table, cannot lift a leased fence's HWM past the lease (to the
/// largest bigint, say, after which no takeover could ever succeed). The leader's writes and
/// the next takeover go on as before.
#[tokio::test]
async fn a_direct_guard_call_cannot_lift_a_leased_fence_past_its_lease() {
    use crate::common::pg::{config, connect_config};
    let f = Fixture::at_epoch_two().await;
    let role = format!("nobody_{}", f.db);
    f.admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .await
        .unwrap();
    let mut as_nobody = config(f.cluster.port(), &f.db);
    as_nobody.user(&role);
    let nobody = connect_config(&as_nobody).await.unwrap();
    for epoch in [i64::MAX, 5000, 3] {
        for call in [
            "SELECT pgfence.guard('sweeper', $1, NULL, true)",
            "SELECT pgfence.guard_slow('sweeper', $1, NULL, true)",
            "SELECT pgfence.guard_full('sweeper', $1, NULL, true)",
        ] {
            let refused = nobody.execute(call, &[&epoch]).await;
            assert_eq!(code(&refused), "PF003", "{call} at {epoch}");
        }
    }
    assert_eq!(f.hwm().await, 2);
    f.leader(2).await.execute(WRITE, &[]).await.unwrap();
    assert_eq!(f.takeover("c").await, 3);
    drop(nobody);
}

/// A proxy configured without the lease that `init --config` registered for its fence still
/// gets the lease's verdicts after its first writes: the guard checks the registered lease
/// on every call that names none (it leaves no marker for the path that checks the HWM
/// alone), so a revoked lease refuses the next write.
#[tokio::test]
async fn a_proxy_without_the_registered_lease_still_sees_it_revoked() {
    let f = Fixture::at_epoch_two().await;
    let proxy = Proxy::start(f.cluster.port(), NO_LEASE).await;
    let c = connect(proxy.port(), &f.db, "-c pgfence.epoch=2").await;
    for _ in 0..3 {
        c.execute(WRITE, &[]).await.unwrap();
        c.batch_execute(WRITE).await.unwrap();
    }
    f.admin
        .batch_execute("DELETE FROM leader_lease WHERE name = 'sweeper'")
        .await
        .unwrap();
    assert_eq!(code(&c.execute(WRITE, &[]).await), "PF003");
    assert_eq!(code(&c.batch_execute(WRITE).await), "PF003");
    assert_eq!(f.hwm().await, 2);
    // Control: straight to Postgres the write lands.
    assert_eq!(write_directly(f.cluster, &f.db).await, 1);
}

/// A lease taken out of a fence's config stops checking it once `init --config` runs with
/// that config: the guard follows the database's registration whoever calls it, so the
/// registration goes too, and an epoch above the old lease's writes as it would without a
/// lease, raising the mark.
#[tokio::test]
async fn a_lease_taken_out_of_the_config_stops_checking_the_fence() {
    let f = Fixture::at_epoch_two().await;
    let without = f.leader(5).await;
    assert_eq!(code(&without.execute(WRITE, &[]).await), "PF003", "above the lease");
    let mut admin = f.cluster.admin(&f.db).await;
    install(&mut admin, f.cluster.port(), NO_LEASE).await;
    let proxy = Proxy::start(f.cluster.port(), NO_LEASE).await;
    let c = connect(proxy.port(), &f.db, "-c pgfence.epoch=5").await;
    c.execute(WRITE, &[]).await.unwrap();
    assert_eq!(f.hwm().await, 5);
    // The old lease's takeovers no longer move the fence.
    f.takeover("z").await;
    assert_eq!(f.hwm().await, 5);
}
