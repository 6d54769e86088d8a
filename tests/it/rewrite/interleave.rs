//! Two leaders at epochs 33 and 34 update one row in every order, forced
//! with explicit transactions and `pg_blocking_pids`: the row ends at 34 and
//! the epoch-33 write never lands after the 34 commit (READ COMMITTED
//! re-checks the rewritten predicate on the row version it waited for).

use std::time::Duration;

use tokio_postgres::Client;

use super::fixture;
use crate::fencing::Fixture;

async fn pid(c: &Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0)
}

/// Waits until backend `pid` is blocked by a lock.
async fn wait_blocked(f: &Fixture, pid: i32) {
    for _ in 0..500 {
        let row = f
            .admin
            .query_one("SELECT cardinality(pg_blocking_pids($1))", &[&pid])
            .await
            .unwrap();
        if row.get::<_, i32>(0) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} never blocked");
}

const UPDATE: &str = "UPDATE sweep_state SET note = $1 WHERE id = 1";

/// `first` holds the row lock, `second` queues behind it, `first` commits.
async fn blocked_order(
    f: &Fixture,
    first: &Client,
    first_note: &str,
    second: Client,
    second_note: &'static str,
) -> u64 {
    first.batch_execute("BEGIN").await.unwrap();
    assert_eq!(first.execute(UPDATE, &[&first_note]).await.unwrap(), 1);
    let second_pid = pid(&second).await;
    let task = tokio::spawn(async move {
        let n = second.execute(UPDATE, &[&second_note]).await.unwrap();
        (n, second)
    });
    wait_blocked(f, second_pid).await;
    first.batch_execute("COMMIT").await.unwrap();
    task.await.unwrap().0
}

#[tokio::test]
async fn rewrite_two_epochs_in_every_order_end_at_the_newer() {
    // 33 then 34, each committed alone.
    let f = fixture(false).await;
    let (a, b) = (f.leader(33).await, f.leader(34).await);
    assert_eq!(a.execute(UPDATE, &[&"a"]).await.unwrap(), 1);
    assert_eq!(b.execute(UPDATE, &[&"b"]).await.unwrap(), 1);
    assert_eq!(f.note().await, ("b".to_owned(), 34));

    // 34 then 33: the stale write reports 0 rows.
    let f = fixture(false).await;
    let (a, b) = (f.leader(33).await, f.leader(34).await);
    assert_eq!(b.execute(UPDATE, &[&"b"]).await.unwrap(), 1);
    assert_eq!(a.execute(UPDATE, &[&"a"]).await.unwrap(), 0);
    assert_eq!(f.note().await, ("b".to_owned(), 34));

    // 33 holds the lock, 34 waits, 33 commits: 34 re-checks and lands.
    let f = fixture(false).await;
    let (a, b) = (f.leader(33).await, f.leader(34).await);
    assert_eq!(blocked_order(&f, &a, "a", b, "b").await, 1);
    assert_eq!(f.note().await, ("b".to_owned(), 34));

    // 34 holds the lock, 33 waits, 34 commits: 33 re-checks and touches nothing.
    let f = fixture(false).await;
    let (a, b) = (f.leader(33).await, f.leader(34).await);
    assert_eq!(blocked_order(&f, &b, "b", a, "a").await, 0);
    assert_eq!(f.note().await, ("b".to_owned(), 34));

    // 34 holds the lock, 33 waits, 34 rolls back: 33 may write (34 never committed).
    let f = fixture(false).await;
    let (a, b) = (f.leader(33).await, f.leader(34).await);
    b.batch_execute("BEGIN").await.unwrap();
    b.execute(UPDATE, &[&"b"]).await.unwrap();
    let a_pid = pid(&a).await;
    let task = tokio::spawn(async move { a.execute(UPDATE, &[&"a"]).await.unwrap() });
    wait_blocked(&f, a_pid).await;
    b.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(task.await.unwrap(), 1);
    assert_eq!(f.note().await, ("a".to_owned(), 33));
}

/// Control: the same blocked order straight to Postgres lets the stale write land.
#[tokio::test]
async fn control_rewrite_interleaving_without_pgfence_goes_backwards() {
    let f = fixture(false).await;
    let (a, b) = (f.direct().await, f.direct().await);
    let stale = "UPDATE sweep_state SET note = $1, last_epoch = 33 WHERE id = 1";
    b.batch_execute("BEGIN; UPDATE sweep_state SET note = 'b', last_epoch = 34 WHERE id = 1")
        .await
        .unwrap();
    let a_pid = pid(&a).await;
    let task = tokio::spawn(async move { a.execute(stale, &[&"a"]).await.unwrap() });
    wait_blocked(&f, a_pid).await;
    b.batch_execute("COMMIT").await.unwrap();
    assert_eq!(task.await.unwrap(), 1);
    assert_eq!(
        f.note().await,
        ("a".to_owned(), 33),
        "the control must show the row going back"
    );
}
