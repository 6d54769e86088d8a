//! A corpus of writes: each rewrite is accepted by Postgres (PREPAREd) and has
//! the same effect as the hand-written predicate version, on identical data.

use pgfence::fence::epoch::Epoch;
use pgfence::sql::name::TableName;
use pgfence::sql::rewrite::{RewriteTarget, rewrite};
use tokio_postgres::Client;

use crate::common::pg::Cluster;

/// Rows at epochs below, at and above 7, and a NULL epoch (counts as 0).
pub const RESET: &str = "
DROP TABLE IF EXISTS items, src;
CREATE TABLE items (id int PRIMARY KEY, note text, n int, last_epoch bigint);
CREATE TABLE src (id int, note text, del bool);
INSERT INTO items VALUES (1,'a',1,0),(2,'b',2,5),(3,'c',3,7),(4,'d',4,9),(5,'e',5,NULL),(6,'f',6,8),(7,'g',7,3);
INSERT INTO src VALUES (1,'s1',false),(3,'s3',true),(4,'s4',false),(8,'s8',false),(9,'s9',true);
";

pub fn target() -> RewriteTarget {
    RewriteTarget {
        tables: vec![TableName::new(Some("public"), "items")],
        column: "last_epoch".into(),
    }
}

/// The table's contents, in order.
pub type Rows = Vec<(i32, Option<String>, Option<i32>, Option<i64>)>;

pub async fn dump(c: &Client) -> Rows {
    c.query("SELECT id, note, n, last_epoch FROM items ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// A fresh database with the `pgfence` schema (rewrites name its type `pgfence.epoch`).
pub async fn initialised_db(cluster: &'static Cluster) -> Client {
    let db = cluster.fresh_db().await;
    let mut c = cluster.admin(&db).await;
    pgfence::fence::install::install(&mut c, &[]).await.unwrap();
    c
}

/// Runs `sql` on freshly reset tables: its row count and the table after it.
pub async fn run(c: &Client, sql: &str) -> (u64, Rows) {
    c.batch_execute(RESET).await.unwrap();
    let n = c.execute(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    (n, dump(c).await)
}

const PREDICATES: &[&str] = &[
    "id = 3",
    "id = 4",
    "id < 4 OR id > 5",
    "n > 2 AND n < 6",
    "note IN ('a', 'e', 'f')",
    "true",
    "id = 1 OR true",
    "last_epoch IS NULL OR id = 2",
    "NOT (id = 6)",
    "id IN (SELECT id FROM src)",
];

/// (client statement, hand-written fenced version) templates for a predicate.
fn shapes(p: &str) -> Vec<(String, String)> {
    let chk = "coalesce(last_epoch, 0) <= 7";
    vec![
        (
            format!("UPDATE items SET note = 'u' WHERE {p}"),
            format!("UPDATE items SET note = 'u', last_epoch = 7 WHERE ({p}) AND {chk}"),
        ),
        (
            format!("UPDATE items SET n = n + 1, last_epoch = 1 WHERE {p}"),
            format!("UPDATE items SET n = n + 1, last_epoch = 7 WHERE ({p}) AND {chk}"),
        ),
        (
            format!("DELETE FROM items WHERE {p}"),
            format!("DELETE FROM items WHERE ({p}) AND {chk}"),
        ),
        (
            format!("UPDATE items AS i SET note = 'v' WHERE {p} RETURNING i.id"),
            format!(
                "UPDATE items AS i SET note = 'v', last_epoch = 7 WHERE ({p}) AND coalesce(i.last_epoch, 0) <= 7 RETURNING i.id"
            ),
        ),
        (
            format!("DELETE FROM items i WHERE {p} RETURNING *"),
            format!("DELETE FROM items i WHERE ({p}) AND coalesce(i.last_epoch, 0) <= 7 RETURNING *"),
        ),
        (
            format!("WITH w AS (UPDATE items SET note = 'w' WHERE {p} RETURNING id) SELECT id FROM w"),
            format!(
                "WITH w AS (UPDATE items SET note = 'w', last_epoch = 7 WHERE ({p}) AND {chk} RETURNING id) SELECT id FROM w"
            ),
        ),
    ]
}

const BESPOKE: &[(&str, &str)] = &[
    (
        "UPDATE items SET note = src.note FROM src WHERE items.id = src.id",
        "UPDATE items SET note = src.note, last_epoch = 7 FROM src WHERE items.id = src.id AND coalesce(items.last_epoch, 0) <= 7",
    ),
    (
        "UPDATE items i SET note = s.note FROM src s WHERE i.id = s.id OR s.del",
        "UPDATE items i SET note = s.note, last_epoch = 7 FROM src s WHERE (i.id = s.id OR s.del) AND coalesce(i.last_epoch, 0) <= 7",
    ),
    (
        "DELETE FROM items USING src WHERE items.id = src.id AND src.del",
        "DELETE FROM items USING src WHERE items.id = src.id AND src.del AND coalesce(items.last_epoch, 0) <= 7",
    ),
    (
        "DELETE FROM items i USING src s WHERE i.id = s.id OR s.id = 9",
        "DELETE FROM items i USING src s WHERE (i.id = s.id OR s.id = 9) AND coalesce(i.last_epoch, 0) <= 7",
    ),
    (
        "UPDATE ONLY (items) SET note = 'only' WHERE id > 2",
        "UPDATE ONLY items SET note = 'only', last_epoch = 7 WHERE id > 2 AND coalesce(last_epoch, 0) <= 7",
    ),
    (
        "DELETE FROM ONLY (public.items) WHERE id < 6",
        "DELETE FROM items WHERE id < 6 AND coalesce(last_epoch, 0) <= 7",
    ),
    (
        "UPDATE items SET note = 'all'",
        "UPDATE items SET note = 'all', last_epoch = 7 WHERE coalesce(last_epoch, 0) <= 7",
    ),
    (
        "DELETE FROM items",
        "DELETE FROM items WHERE coalesce(last_epoch, 0) <= 7",
    ),
    (
        "INSERT INTO items (id, note) VALUES (10, 'n'), (11, 'm')",
        "INSERT INTO items (id, note, last_epoch) VALUES (10, 'n', 7), (11, 'm', 7)",
    ),
    (
        "INSERT INTO items (id, note, last_epoch) VALUES (12, 'n', 99), (13, 'o', DEFAULT)",
        "INSERT INTO items (id, note, last_epoch) VALUES (12, 'n', 7), (13, 'o', 7)",
    ),
    (
        // An ordered-set aggregate (its WITHIN GROUP is no GROUP BY), and a join alias
        // named `conflict` (its ON no ON CONFLICT).
        "INSERT INTO items (id, note) SELECT 90 + count(*), mode() WITHIN GROUP (ORDER BY note) FROM src GROUP BY del",
        "INSERT INTO items (id, note, last_epoch) SELECT 90 + count(*), mode() WITHIN GROUP (ORDER BY note), 7 \
         FROM src GROUP BY del",
    ),
    (
        "INSERT INTO items (id, note) SELECT s.id + 200, s.note FROM src s JOIN src conflict ON conflict.id = s.id",
        "INSERT INTO items (id, note, last_epoch) SELECT s.id + 200, s.note, 7 FROM src s JOIN src conflict \
         ON conflict.id = s.id",
    ),
    (
        "INSERT INTO items (id, note) SELECT id + 100, note FROM src WHERE del",
        "INSERT INTO items (id, note, last_epoch) SELECT id + 100, note, 7 FROM src WHERE del",
    ),
    (
        "INSERT INTO items (id, last_epoch, note) SELECT id + 500, 1, note FROM src WHERE NOT del",
        "INSERT INTO items (id, last_epoch, note) SELECT id + 500, 7, note FROM src WHERE NOT del",
    ),
    (
        "INSERT INTO items (id, last_epoch) SELECT id + 700, n FROM items ORDER BY 2 DESC LIMIT 2",
        "INSERT INTO items (id, last_epoch) SELECT id, 7 FROM (SELECT id + 700, n FROM items ORDER BY 2 DESC LIMIT 2) q (id, e)",
    ),
    (
        "INSERT INTO items (id, note, n, last_epoch) SELECT 600, 'lit', '5', 2",
        "INSERT INTO items (id, note, n, last_epoch) SELECT 600, 'lit', '5', 7",
    ),
    (
        "INSERT INTO items (id, note, n) (SELECT id + 800, 'par', '8' FROM src WHERE del)",
        "INSERT INTO items (id, note, n, last_epoch) SELECT id + 800, 'par', 8, 7 FROM src WHERE del",
    ),
    (
        "INSERT INTO items (id, n, last_epoch) WITH s AS (SELECT id FROM src WHERE NOT del) SELECT id + 900, '9', 1 FROM s",
        "INSERT INTO items (id, n, last_epoch) SELECT id + 900, 9, 7 FROM src WHERE NOT del",
    ),
    (
        "INSERT INTO items (id, last_epoch) SELECT id + 200, 1 FROM src UNION ALL SELECT 300, 2",
        "INSERT INTO items (id, last_epoch) SELECT id, 7 FROM (SELECT id + 200, 1 FROM src UNION ALL SELECT 300, 2) q (id, e)",
    ),
    (
        "INSERT INTO items (note, id) SELECT DISTINCT note, id + 400 FROM src ORDER BY 2 LIMIT 2",
        "INSERT INTO items (note, id, last_epoch) SELECT DISTINCT note, id + 400, 7 FROM src ORDER BY 2 LIMIT 2",
    ),
    (
        "INSERT INTO items (id, note) VALUES (3, 'up'), (4, 'up2'), (50, 'new') ON CONFLICT (id) DO UPDATE SET note = excluded.note",
        "INSERT INTO items (id, note, last_epoch) VALUES (3, 'up', 7), (4, 'up2', 7), (50, 'new', 7) ON CONFLICT (id) DO UPDATE SET note = excluded.note, last_epoch = 7 WHERE coalesce(items.last_epoch, 0) <= 7",
    ),
    (
        "INSERT INTO items AS t (id, note) VALUES (2, 'x'), (6, 'y') ON CONFLICT (id) DO UPDATE SET note = t.note || excluded.note, last_epoch = 0 WHERE t.n > 100 OR t.id <> 0",
        "INSERT INTO items AS t (id, note, last_epoch) VALUES (2, 'x', 7), (6, 'y', 7) ON CONFLICT (id) DO UPDATE SET note = t.note || excluded.note, last_epoch = 7 WHERE (t.n > 100 OR t.id <> 0) AND coalesce(t.last_epoch, 0) <= 7",
    ),
    (
        // A select list right before ON CONFLICT (no FROM).
        "INSERT INTO items (id, note) SELECT 4, 'sel' ON CONFLICT (id) DO UPDATE SET note = excluded.note",
        "INSERT INTO items (id, note, last_epoch) SELECT 4, 'sel', 7 ON CONFLICT (id) DO UPDATE SET note = excluded.note, last_epoch = 7 WHERE coalesce(items.last_epoch, 0) <= 7",
    ),
    (
        "WITH w AS (INSERT INTO items (id, note) SELECT 3, 'cte' ON CONFLICT (id) DO UPDATE SET note = 'cte-up' RETURNING id) SELECT count(*) FROM w",
        "WITH w AS (INSERT INTO items (id, note, last_epoch) SELECT 3, 'cte', 7 ON CONFLICT (id) DO UPDATE SET note = 'cte-up', last_epoch = 7 WHERE coalesce(items.last_epoch, 0) <= 7 RETURNING id) SELECT count(*) FROM w",
    ),
    (
        "INSERT INTO items (id, note) VALUES (5, 'z'), (60, 'z') ON CONFLICT DO NOTHING",
        "INSERT INTO items (id, note, last_epoch) VALUES (5, 'z', 7), (60, 'z', 7) ON CONFLICT DO NOTHING",
    ),
    (
        "MERGE INTO items t USING src s ON t.id = s.id WHEN MATCHED AND s.del THEN DELETE WHEN MATCHED THEN UPDATE SET note = s.note WHEN NOT MATCHED THEN INSERT (id, note) VALUES (s.id, s.note)",
        "MERGE INTO items t USING src s ON t.id = s.id WHEN MATCHED AND s.del AND coalesce(t.last_epoch, 0) <= 7 THEN DELETE WHEN MATCHED AND coalesce(t.last_epoch, 0) <= 7 THEN UPDATE SET note = s.note, last_epoch = 7 WHEN NOT MATCHED THEN INSERT (id, note, last_epoch) VALUES (s.id, s.note, 7)",
    ),
    (
        "MERGE INTO items USING src ON items.id = src.id WHEN MATCHED THEN UPDATE SET last_epoch = 2, n = -1 WHEN NOT MATCHED THEN DO NOTHING",
        "MERGE INTO items USING src ON items.id = src.id WHEN MATCHED AND coalesce(items.last_epoch, 0) <= 7 THEN UPDATE SET last_epoch = 7, n = -1 WHEN NOT MATCHED THEN DO NOTHING",
    ),
    (
        "WITH d AS (DELETE FROM items WHERE id < 4 RETURNING id) UPDATE items SET note = 'after' WHERE id IN (SELECT id + 3 FROM d)",
        "WITH d AS (DELETE FROM items WHERE id < 4 AND coalesce(last_epoch, 0) <= 7 RETURNING id) UPDATE items SET note = 'after', last_epoch = 7 WHERE id IN (SELECT id + 3 FROM d) AND coalesce(last_epoch, 0) <= 7",
    ),
    (
        "/* c */ UPDATE items SET note = 'it''s; -- not a comment' WHERE id = 2 -- trailing\n",
        "UPDATE items SET note = 'it''s; -- not a comment', last_epoch = 7 WHERE id = 2 AND coalesce(last_epoch, 0) <= 7",
    ),
];

/// Every (client, hand-written) pair of the corpus.
pub fn corpus() -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = PREDICATES.iter().flat_map(|p| shapes(p)).collect();
    all.extend(BESPOKE.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())));
    all
}

#[tokio::test]
async fn rewrite_corpus_matches_hand_written_fencing_on_postgres() {
    let c = initialised_db(Cluster::shared()).await;
    let corpus = corpus();
    assert!(corpus.len() >= 60, "{}", corpus.len());
    let epoch = Epoch::new(7).unwrap();
    for (client, hand) in &corpus {
        let out = rewrite(client, &target(), epoch).unwrap_or_else(|u| panic!("{client}: {u:?}"));
        c.batch_execute(RESET).await.unwrap();
        c.batch_execute(&format!("PREPARE pf_check AS {out}; DEALLOCATE pf_check"))
            .await
            .unwrap_or_else(|e| panic!("PREPARE of {out}: {e:?}"));
        let got = run(&c, &out).await;
        let want = run(&c, hand).await;
        assert_eq!(got, want, "\nclient: {client}\nrewrite: {out}\nhand: {hand}");
    }
    // Control: the unfenced statements do overwrite newer rows somewhere.
    let mut differs = 0;
    for (client, hand) in &corpus {
        if run(&c, client).await != run(&c, hand).await {
            differs += 1;
        }
    }
    assert!(differs > corpus.len() / 2, "only {differs} unfenced statements differ");
}
