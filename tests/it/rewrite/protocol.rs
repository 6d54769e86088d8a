//! The extended protocol: statements are rewritten for the epoch current at
//! Bind, whenever they were prepared.

use super::fixture;
use crate::fencing::code;

#[tokio::test]
async fn rewrite_statement_prepared_before_the_epoch_uses_the_later_epoch() {
    let f = fixture(false).await;
    let s = f.session("").await;
    let st = s
        .prepare("UPDATE sweep_state SET note = $1 WHERE id = $2")
        .await
        .unwrap();
    assert_eq!(code(&s.execute(&st, &[&"none", &1i32]).await), "PF002");
    s.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    assert_eq!(s.execute(&st, &[&"five", &1i32]).await.unwrap(), 1);
    assert_eq!(f.note().await, ("five".to_owned(), 5));
}

#[tokio::test]
async fn rewrite_named_statement_is_reprepared_across_epoch_changes() {
    let f = fixture(false).await;
    let s = f.leader(5).await;
    let st = s
        .prepare("UPDATE sweep_state SET note = $1, last_epoch = $2 WHERE id = 1 RETURNING last_epoch")
        .await
        .unwrap();
    let epoch_of = |rows: Vec<tokio_postgres::Row>| rows.first().map(|r| r.get::<_, i64>(0));
    assert_eq!(epoch_of(s.query(&st, &[&"five", &99i64]).await.unwrap()), Some(5));
    s.batch_execute("SET pgfence.epoch = 6").await.unwrap();
    assert_eq!(epoch_of(s.query(&st, &[&"six", &99i64]).await.unwrap()), Some(6));
    // Back to 5 (a stale session): the row written at 6 is not touched.
    s.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    assert_eq!(epoch_of(s.query(&st, &[&"stale", &99i64]).await.unwrap()), None);
    assert_eq!(f.note().await, ("six".to_owned(), 6));
    // The unnamed statement (parse, bind, execute in one batch) too, and the session still works.
    let n = s
        .execute("INSERT INTO items (id, note) VALUES ($1, $2)", &[&1i32, &"x"])
        .await
        .unwrap();
    assert_eq!(n, 1);
    let e: i64 = f
        .admin
        .query_one("SELECT last_epoch FROM items WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(e, 5);
}

#[tokio::test]
async fn rewrite_set_inside_a_transaction_applies_to_the_next_execute() {
    let f = fixture(false).await;
    let s = f.leader(3).await;
    let st = s.prepare("DELETE FROM items WHERE id = $1").await.unwrap();
    f.admin
        .batch_execute("INSERT INTO items VALUES (1, 'a', 1, 4), (2, 'b', 2, 2)")
        .await
        .unwrap();
    s.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        s.execute(&st, &[&1i32]).await.unwrap(),
        0,
        "epoch 3 cannot delete a row at 4"
    );
    s.batch_execute("SET LOCAL pgfence.epoch = 4").await.unwrap();
    assert_eq!(s.execute(&st, &[&1i32]).await.unwrap(), 1);
    s.batch_execute("COMMIT").await.unwrap();
    // SET LOCAL ended: back at 3.
    assert_eq!(s.execute(&st, &[&2i32]).await.unwrap(), 1);
}
