//! Lock coupling between writers and takeovers, made deterministic with
//! pg_blocking_pids.

use std::time::{Duration, Instant};

use super::{Fixture, code, take_lease};

/// Waits until some backend is blocked by another; returns whether it happened.
async fn someone_blocked(f: &Fixture) -> bool {
    for _ in 0..100 {
        let n: i64 = f
            .admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                   AND cardinality(pg_blocking_pids(pid)) > 0",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn takeover_waits_for_a_transaction_past_the_guard() {
    let f = Fixture::new().await;
    let e1 = f.takeover("a").await;
    let a = f.leader(e1).await;
    a.batch_execute("BEGIN; UPDATE sweep_state SET note = 'in-flight' WHERE id = 1")
        .await
        .unwrap();
    let rival = f.direct().await;
    let takeover = tokio::spawn(async move { take_lease(&rival, "b").await });
    assert!(
        someone_blocked(&f).await,
        "the takeover must wait for the in-flight stale transaction"
    );
    assert!(!takeover.is_finished());
    a.batch_execute("COMMIT").await.unwrap();
    let e2 = takeover.await.unwrap();
    assert_eq!(e2, e1 + 1);
    assert_eq!(
        f.note().await.0,
        "in-flight",
        "the transaction that passed the guard commits"
    );
    assert_eq!(
        code(
            &a.execute("UPDATE sweep_state SET note = 'late' WHERE id = 1", &[])
                .await
        ),
        "PF001"
    );
}

#[tokio::test]
async fn renewal_does_not_block_behind_the_leaders_writes() {
    let f = Fixture::new().await;
    let e1 = f.takeover("a").await;
    let a = f.leader(e1).await;
    a.batch_execute("BEGIN; UPDATE sweep_state SET note = 'open' WHERE id = 1")
        .await
        .unwrap();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&e1];
    let renew = f.admin.query_opt(
        "UPDATE leader_lease SET expires_at = now() + interval '30 s'
         WHERE name = 'sweeper' AND holder = 'a' AND epoch = $1 AND expires_at > now() RETURNING epoch",
        &params,
    );
    let row = tokio::time::timeout(Duration::from_secs(5), renew)
        .await
        .expect("renewal blocked")
        .unwrap();
    assert_eq!(row.map(|r| r.get::<_, i64>(0)), Some(e1));
    a.batch_execute("COMMIT").await.unwrap();
}

#[tokio::test]
async fn takeover_is_not_starved_by_a_stream_of_writers() {
    let f = Fixture::new().await;
    let e1 = f.takeover("a").await;
    let stop = Instant::now() + Duration::from_secs(8);
    let mut writers = Vec::new();
    for _ in 0..4 {
        let s = f.leader(e1).await;
        writers.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let r = s
                    .batch_execute(
                        "BEGIN; UPDATE sweep_state SET note = 'w' WHERE id = 1; SELECT pg_sleep(0.05); COMMIT",
                    )
                    .await;
                if code(&r) == "PF001" {
                    return;
                }
                let _ = s.batch_execute("ROLLBACK").await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let rival = f.direct().await;
    tokio::time::timeout(Duration::from_secs(5), take_lease(&rival, "b"))
        .await
        .expect("takeover starved");
    assert!(started.elapsed() < Duration::from_secs(5));
    for w in writers {
        w.await.unwrap();
    }
}

#[tokio::test]
async fn prepared_transaction_keeps_blocking_takeover_until_resolved() {
    let f = Fixture::new().await;
    let e1 = f.takeover("a").await;
    let a = f.leader(e1).await;
    a.batch_execute("BEGIN; UPDATE sweep_state SET note = 'prepared' WHERE id = 1; PREPARE TRANSACTION 'pf1'")
        .await
        .unwrap();
    let rival = f.direct().await;
    let takeover = tokio::spawn(async move { take_lease(&rival, "b").await });
    assert!(someone_blocked(&f).await);
    f.admin.batch_execute("COMMIT PREPARED 'pf1'").await.unwrap();
    takeover.await.unwrap();
    assert_eq!(f.note().await.0, "prepared");
}

/// Without a lease the takeover is the first write of a higher epoch, which raises the
/// HWM: it waits for the transactions of the old epoch already past the guard, whether
/// their guard took the full path (the session's first write) or the short one (a later
/// transaction). Then the old epoch is refused. Control: straight to Postgres the old
/// epoch's transaction commits after the newer write.
#[tokio::test]
async fn a_bump_without_a_lease_waits_for_a_transaction_past_the_guard() {
    let f = Fixture::with(crate::common::pg::Cluster::shared(), super::NO_LEASE).await;
    for (round, earlier_write) in [false, true].into_iter().enumerate() {
        let e = 10 * (round as i64 + 1);
        let a = f.leader(e).await;
        if earlier_write {
            a.execute("UPDATE sweep_state SET note = 'first' WHERE id = 1", &[])
                .await
                .unwrap();
        }
        a.batch_execute("BEGIN; UPDATE sweep_state SET note = 'in-flight' WHERE id = 1")
            .await
            .unwrap();
        let b = f.leader(e + 1).await;
        let bump = tokio::spawn(async move {
            b.execute("INSERT INTO sweep_state VALUES (100 + $1, 'b', 0)", &[&(round as i32)])
                .await
                .map(|n| (n, b))
        });
        assert!(
            someone_blocked(&f).await,
            "round {round}: the bump must wait for the open transaction"
        );
        assert!(!bump.is_finished());
        a.batch_execute("COMMIT").await.unwrap();
        let (n, _b) = bump.await.unwrap().unwrap();
        assert_eq!(n, 1);
        assert_eq!(f.note().await.0, "in-flight");
        assert_eq!(f.hwm().await, e + 1);
        assert_eq!(
            code(
                &a.execute("UPDATE sweep_state SET note = 'late' WHERE id = 1", &[])
                    .await
            ),
            "PF001"
        );
    }
    // Control: straight to Postgres nothing waits, and the old epoch's write lands last.
    let a = f.direct().await;
    a.batch_execute("BEGIN; UPDATE sweep_state SET note = 'stale' WHERE id = 1")
        .await
        .unwrap();
    let b = f.direct().await;
    b.execute("INSERT INTO sweep_state VALUES (200, 'b', 0)", &[])
        .await
        .unwrap();
    a.batch_execute("COMMIT").await.unwrap();
    assert_eq!(f.note().await.0, "stale");
}
