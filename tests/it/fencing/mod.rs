//! Reject-mode fencing through the proxy, against a real Postgres.
//!
//! Every negative test has a control: the same scenario sent straight to
//! Postgres (no pgfence) lets the stale write land.

mod copy_in;
mod declare;
mod durability;
mod encodings;
mod locking;
mod misread;
mod model;
pub(crate) mod own_statement;
mod portals;
mod positions;
mod short_path;
mod statement_names;
mod tx_ends;
mod writes;

use pgfence::config::RawConfig;
use tokio_postgres::Client;

use crate::common::inproc::Proxy;
use crate::common::pg::{Cluster, connect, try_connect};
use crate::common::raw::Raw;

/// The seed design's tables, a fenced `sweep_state`, an unfenced `audit`.
pub const SEED_SQL: &str = "
CREATE TABLE leader_lease (
  name text PRIMARY KEY, holder text, epoch bigint NOT NULL DEFAULT 0,
  expires_at timestamptz NOT NULL DEFAULT '-infinity');
CREATE TABLE sweep_state (id int PRIMARY KEY, note text, last_epoch bigint NOT NULL DEFAULT 0);
CREATE TABLE audit (id serial PRIMARY KEY, note text);
INSERT INTO leader_lease (name) VALUES ('sweeper');
INSERT INTO sweep_state VALUES (1, 'init', 0);
";

/// One fence over `sweep_state` without a lease.
pub const NO_LEASE: &str = "[[fence]]\nname = \"sweeper\"\ntables = [\"sweep_state\"]\n";

/// The fence config used by most tests.
pub fn fence_toml() -> String {
    "[[fence]]\nname = \"sweeper\"\ntables = [\"public.sweep_state\"]\n[fence.lease]\ntable = \"public.leader_lease\"\n"
        .to_owned()
}

/// A fresh database with the seed tables, `pgfence init` done, and a proxy.
pub struct Fixture {
    pub cluster: &'static Cluster,
    pub db: String,
    pub proxy: Proxy,
    pub admin: Client,
}

impl Fixture {
    pub async fn new() -> Fixture {
        Self::with(Cluster::shared(), &fence_toml()).await
    }

    pub async fn with(cluster: &'static Cluster, toml: &str) -> Fixture {
        let db = cluster.fresh_db().await;
        let mut admin = cluster.admin(&db).await;
        admin.batch_execute(SEED_SQL).await.unwrap();
        install(&mut admin, cluster.port(), toml).await;
        let proxy = Proxy::start(cluster.port(), toml).await;
        Fixture {
            cluster,
            db,
            proxy,
            admin,
        }
    }

    /// A session through pgfence with these libpq options.
    pub async fn session(&self, options: &str) -> Client {
        connect(self.proxy.port(), &self.db, options).await
    }

    /// A session through pgfence declaring `epoch` at startup.
    pub async fn leader(&self, epoch: i64) -> Client {
        self.session(&format!("-c pgfence.epoch={epoch}")).await
    }

    /// A fixture whose lease is at epoch 2: epoch 1 is stale, 3 above the lease.
    pub async fn at_epoch_two() -> Fixture {
        let f = Fixture::new().await;
        f.takeover("a").await;
        f.takeover("b").await;
        f
    }

    /// A raw-protocol session on `port` (pgfence's or Postgres') declaring `epoch` at
    /// startup, with these extra startup parameters.
    pub async fn raw(&self, port: u16, epoch: &str, extra: &[(&str, &str)]) -> Raw {
        let mut params = vec![
            ("user", "postgres"),
            ("database", self.db.as_str()),
            ("pgfence.epoch", epoch),
        ];
        params.extend_from_slice(extra);
        let (raw, msgs) = Raw::startup(port, &params).await;
        assert_eq!(msgs.last().map(|m| m.tag), Some(b'Z'), "{msgs:?}");
        raw
    }

    /// The verdict on a stale write run on `port`: through pgfence refused with `code`, the
    /// row as it was; straight to Postgres (the control) no error, the row written, then put
    /// back.
    pub async fn verdict(&self, port: u16, got: Vec<String>, code: &str) {
        if port == self.proxy.port() {
            assert_eq!(got, [code]);
            assert_eq!(self.note().await.0, "init");
        } else {
            assert!(got.is_empty(), "{got:?}");
            assert_eq!(self.note().await.0, "stale");
            self.put_back().await;
        }
    }

    /// Puts `sweep_state`'s row back as the seed has it, after a control run wrote it.
    pub async fn put_back(&self) {
        self.admin
            .batch_execute("UPDATE sweep_state SET note = 'init' WHERE id = 1")
            .await
            .unwrap();
    }

    /// Rows in the unfenced `audit` table.
    pub async fn audit_rows(&self) -> i64 {
        self.admin
            .query_one("SELECT count(*) FROM audit", &[])
            .await
            .unwrap()
            .get(0)
    }

    /// A session straight to Postgres (the control).
    pub async fn direct(&self) -> Client {
        connect(self.cluster.port(), &self.db, "").await
    }

    /// The seed's acquire, forcing expiry first: returns the new epoch.
    pub async fn takeover(&self, holder: &str) -> i64 {
        take_lease(&self.admin, holder).await
    }

    pub async fn note(&self) -> (String, i64) {
        let row = self
            .admin
            .query_one("SELECT note, last_epoch FROM sweep_state WHERE id = 1", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    pub async fn hwm(&self) -> i64 {
        self.admin
            .query_one("SELECT hwm FROM pgfence.fence WHERE name = 'sweeper'", &[])
            .await
            .unwrap()
            .get(0)
    }
}

/// Runs `pgfence init` (the library call) with the fences of `toml`.
pub async fn install(admin: &mut Client, port: u16, toml: &str) {
    let toml = format!("upstream = \"127.0.0.1:{port}\"\n{toml}");
    let config = RawConfig::from_toml(&toml).unwrap().validate().unwrap();
    pgfence::fence::install::install(admin, &config.fences).await.unwrap();
}

/// Expires the lease and acquires it for `holder` with the seed's CAS UPDATE.
pub async fn take_lease(client: &Client, holder: &str) -> i64 {
    client
        .execute(
            "UPDATE leader_lease SET expires_at = '-infinity' WHERE name = 'sweeper'",
            &[],
        )
        .await
        .unwrap();
    let row = client
        .query_one(
            "UPDATE leader_lease SET holder = $1, epoch = epoch + 1, expires_at = now() + interval '30 s'
             WHERE name = 'sweeper' AND (holder IS NULL OR holder = $1 OR expires_at < now()) RETURNING epoch",
            &[&holder],
        )
        .await
        .unwrap();
    row.get(0)
}

/// The SQLSTATE of a failed call, or "ok".
pub fn code<T>(r: &Result<T, tokio_postgres::Error>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e
            .code()
            .map_or_else(|| format!("no sqlstate: {e}"), |c| c.code().to_owned()),
    }
}

/// The seed's story through pgfence: the paused leader's write is refused and
/// the new leader's row survives.
#[tokio::test]
async fn stale_leader_write_is_rejected_with_pf001_and_row_survives() {
    let f = Fixture::new().await;
    let e1 = f.takeover("node-a").await;
    let a = f.leader(e1).await;
    a.execute(
        "UPDATE sweep_state SET note = 'a', last_epoch = $1 WHERE id = 1",
        &[&e1],
    )
    .await
    .unwrap();
    // node-a pauses; its lease expires; node-b takes over.
    let e2 = f.takeover("node-b").await;
    let b = f.leader(e2).await;
    b.execute(
        "UPDATE sweep_state SET note = 'b', last_epoch = $1 WHERE id = 1",
        &[&e2],
    )
    .await
    .unwrap();
    // node-a wakes up and writes, still believing it leads.
    let r = a
        .execute(
            "UPDATE sweep_state SET note = 'a-stale', last_epoch = $1 WHERE id = 1",
            &[&e1],
        )
        .await;
    assert_eq!(code(&r), "PF001");
    let msg = r.unwrap_err().as_db_error().unwrap().message().to_owned();
    assert!(
        msg.contains("epoch 1 is stale for fence \"sweeper\" (current epoch 2)"),
        "{msg}"
    );
    assert_eq!(f.note().await, ("b".to_owned(), 2));
}

/// The control for the test above: the same story straight to Postgres corrupts the row.
#[tokio::test]
async fn control_stale_leader_write_lands_without_pgfence() {
    let f = Fixture::new().await;
    let e1 = f.takeover("node-a").await;
    let a = f.direct().await;
    a.execute(
        "UPDATE sweep_state SET note = 'a', last_epoch = $1 WHERE id = 1",
        &[&e1],
    )
    .await
    .unwrap();
    let e2 = f.takeover("node-b").await;
    let b = f.direct().await;
    b.execute(
        "UPDATE sweep_state SET note = 'b', last_epoch = $1 WHERE id = 1",
        &[&e2],
    )
    .await
    .unwrap();
    let r = a
        .execute(
            "UPDATE sweep_state SET note = 'a-stale', last_epoch = $1 WHERE id = 1",
            &[&e1],
        )
        .await;
    assert_eq!(code(&r), "ok");
    assert_eq!(
        f.note().await,
        ("a-stale".to_owned(), 1),
        "the control must show the corruption"
    );
}

/// Once a takeover commits, the stale epoch is refused before the new leader writes anything.
#[tokio::test]
async fn takeover_alone_fences_the_old_epoch() {
    let f = Fixture::new().await;
    let e1 = f.takeover("node-a").await;
    let a = f.leader(e1).await;
    a.execute("UPDATE sweep_state SET note = 'a' WHERE id = 1", &[])
        .await
        .unwrap();
    f.takeover("node-b").await;
    let r = a
        .execute("UPDATE sweep_state SET note = 'a-stale' WHERE id = 1", &[])
        .await;
    assert_eq!(code(&r), "PF001");
    assert_eq!(f.note().await.0, "a");
}

/// A fresh database with the seed tables but without `pgfence init`, and a proxy with the
/// fences of `toml` in front of it: a fenced UPDATE at epoch 1 is PF005, with a hint to run
/// init, in the extended and the simple protocol alike.
pub async fn writes_without_init_get_pf005(toml: &str) -> (&'static Cluster, String, Proxy) {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let admin = cluster.admin(&db).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    let proxy = Proxy::start(cluster.port(), toml).await;
    let s = connect(proxy.port(), &db, "-c pgfence.epoch=1").await;
    for r in [
        s.execute("UPDATE sweep_state SET note = 'x' WHERE id = 1", &[])
            .await
            .map(|_| ()),
        s.batch_execute("UPDATE sweep_state SET note = 'x' WHERE id = 1").await,
    ] {
        assert_eq!(code(&r), "PF005");
        let msg = r.unwrap_err().as_db_error().unwrap().clone();
        assert!(msg.hint().unwrap_or_default().contains("pgfence init"), "{msg:?}");
        // Like every rejection, it names the fence and the declared epoch.
        assert!(
            msg.message().contains("fence \"") && msg.message().contains("epoch 1"),
            "{msg:?}"
        );
    }
    (cluster, db, proxy)
}

#[tokio::test]
async fn database_without_init_gets_pf005() {
    let (_, db, proxy) = writes_without_init_get_pf005(&fence_toml()).await;
    // PF005 wins over PF002 (no epoch) too.
    let s = connect(proxy.port(), &db, "").await;
    assert_eq!(code(&s.batch_execute("DELETE FROM sweep_state").await), "PF005");
    // An invalid epoch is PF003 all the same, without the current epoch no schema holds.
    let r = s.batch_execute("SET pgfence.epoch = 0").await;
    assert_eq!(code(&r), "PF003");
    let msg = r.unwrap_err().as_db_error().unwrap().message().to_owned();
    assert!(
        msg.ends_with("an epoch is an integer from 1 to 9223372036854775807"),
        "{msg}"
    );
    // And so is an invalid startup declaration, refused as FATAL.
    let r = try_connect(proxy.port(), &db, "-c pgfence.epoch=0").await;
    assert_eq!(code(&r), "PF003");
    let msg = r.err().unwrap().as_db_error().unwrap().clone();
    assert_eq!(msg.severity(), "FATAL");
    assert!(
        msg.message()
            .ends_with("an epoch is an integer from 1 to 9223372036854775807"),
        "{msg:?}"
    );
    // Reads and unfenced writes are not affected.
    s.batch_execute("SELECT * FROM sweep_state; INSERT INTO audit (note) VALUES ('x')")
        .await
        .unwrap();
}

/// `pgfence init` undone under a session that already passed the guard: its next fenced
/// write is PF005 in both protocols (in the extended one, re-planning the prepared guard
/// at Bind is what fails).
#[tokio::test]
async fn schema_dropped_under_a_session_gives_pf005() {
    let f = Fixture::new().await;
    let e = f.takeover("a").await;
    let s = f.leader(e).await;
    let write = "UPDATE sweep_state SET note = 'w' WHERE id = 1";
    s.execute(write, &[]).await.unwrap();
    s.batch_execute(write).await.unwrap();
    f.admin.batch_execute("DROP SCHEMA pgfence CASCADE").await.unwrap();
    assert_eq!(code(&s.execute(write, &[]).await), "PF005");
    assert_eq!(code(&s.batch_execute(write).await), "PF005");
    // Control: the same write straight to Postgres lands, with no fence left to stop it.
    assert_eq!(f.direct().await.execute(write, &[]).await.unwrap(), 1);
}

#[tokio::test]
async fn epoch_above_the_lease_is_pf003() {
    let f = Fixture::new().await;
    let e1 = f.takeover("node-a").await;
    let s = f.leader(e1 + 1).await;
    let r = s
        .execute("UPDATE sweep_state SET note = 'future' WHERE id = 1", &[])
        .await;
    assert_eq!(code(&r), "PF003");
    assert_eq!(f.note().await.0, "init");
    // Nobody declared a future epoch and locked the real leader out.
    let a = f.leader(e1).await;
    a.execute("UPDATE sweep_state SET note = 'a' WHERE id = 1", &[])
        .await
        .unwrap();
}

/// With the lease row gone no epoch is granted, not even the last leader's; the message
/// still gives the fence's current epoch (its HWM), not the missing lease's 0.
#[tokio::test]
async fn missing_lease_row_grants_no_epoch() {
    let f = Fixture::new().await;
    f.takeover("node-a").await;
    let e2 = f.takeover("node-b").await;
    f.admin.execute("DELETE FROM leader_lease", &[]).await.unwrap();
    assert_eq!(f.hwm().await, e2);
    let s = f.leader(e2).await;
    let write = "UPDATE sweep_state SET note = 'x' WHERE id = 1";
    for r in [s.execute(write, &[]).await.map(drop), s.batch_execute(write).await] {
        let e = r.expect_err("no epoch is granted");
        let db = e.as_db_error().expect("raised by Postgres");
        assert_eq!(db.code().code(), "PF003");
        assert_eq!(
            db.message(),
            format!(
                "pgfence: epoch {e2} is above the epoch the lease granted for fence \"sweeper\" \
                 (current epoch {e2}; the lease grants no epoch: its row is missing or its epoch is 0)"
            )
        );
    }
    assert_eq!(f.note().await.0, "init");
}

#[tokio::test]
async fn reads_and_unfenced_writes_need_no_epoch() {
    let f = Fixture::new().await;
    let s = f.session("").await;
    s.query("SELECT * FROM sweep_state FOR UPDATE", &[]).await.unwrap();
    s.execute("INSERT INTO audit (note) VALUES ($1)", &[&"x"])
        .await
        .unwrap();
    s.batch_execute("EXPLAIN UPDATE sweep_state SET note = 'x'")
        .await
        .unwrap();
    s.batch_execute("VACUUM sweep_state").await.unwrap();
    s.batch_execute("VACUUM ANALYZE sweep_state").await.unwrap();
    s.batch_execute("ANALYZE sweep_state").await.unwrap();
    s.batch_execute("CREATE INDEX ON sweep_state (note)").await.unwrap();
    let rows: Vec<bytes::Bytes> =
        futures_util::TryStreamExt::try_collect(s.copy_out("COPY sweep_state TO STDOUT").await.unwrap())
            .await
            .unwrap();
    assert!(!rows.is_empty());
}

#[tokio::test]
async fn many_same_epoch_writers_see_no_false_rejections() {
    let f = Fixture::new().await;
    let e1 = f.takeover("node-a").await;
    f.admin
        .execute(
            "INSERT INTO sweep_state SELECT g, 'w', 0 FROM generate_series(100, 115) g",
            &[],
        )
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for w in 0..16 {
        let s = f.leader(e1).await;
        tasks.push(tokio::spawn(async move {
            let mut failures = 0;
            for i in 0..40 {
                let r = if i % 2 == 0 {
                    s.execute(
                        "UPDATE sweep_state SET note = $1 WHERE id = $2",
                        &[&format!("{i}"), &(100 + w)],
                    )
                    .await
                } else {
                    s.batch_execute(&format!(
                        "BEGIN; UPDATE sweep_state SET note = '{i}' WHERE id = {}; COMMIT",
                        100 + w
                    ))
                    .await
                    .map(|_| 1)
                };
                failures += u32::from(r.is_err());
            }
            failures
        }));
    }
    let mut failures = 0;
    for t in tasks {
        failures += t.await.unwrap();
    }
    assert_eq!(failures, 0);
    assert_eq!(f.hwm().await, e1);
}

/// With `standard_conforming_strings = off`, `'a\''` ends early and what looks
/// like the inside of a string is a DELETE: pgfence must read it as Postgres does.
#[tokio::test]
async fn write_hidden_by_standard_conforming_strings_off_is_still_fenced() {
    let f = Fixture::new().await;
    let sql = r"SELECT 'a\''; DELETE FROM sweep_state WHERE id = 1; -- '";
    let s = f.session("-c standard_conforming_strings=off").await;
    assert_eq!(code(&s.batch_execute(sql).await), "PF002");
    let on = f.session("").await;
    on.batch_execute("SET standard_conforming_strings = off").await.unwrap();
    assert_eq!(
        code(&on.batch_execute(sql).await),
        "PF002",
        "after a SET, from ParameterStatus"
    );
    assert_eq!(f.note().await.0, "init");
    // Control: straight to Postgres the DELETE runs.
    let direct = connect(f.cluster.port(), &f.db, "-c standard_conforming_strings=off").await;
    direct.batch_execute(sql).await.unwrap();
    let n: i64 = f
        .admin
        .query_one("SELECT count(*) FROM sweep_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

/// Fence identity is (database, table): a fence restricted to one database
/// does not touch a table of the same name in another.
#[tokio::test]
async fn fence_restricted_to_a_database_leaves_other_databases_alone() {
    let cluster = Cluster::shared();
    let fenced_db = cluster.fresh_db().await;
    let other_db = cluster.fresh_db().await;
    let toml = format!("[[fence]]\nname = \"sweeper\"\ndatabase = \"{fenced_db}\"\ntables = [\"sweep_state\"]\n");
    for db in [&fenced_db, &other_db] {
        let mut admin = cluster.admin(db).await;
        admin.batch_execute(SEED_SQL).await.unwrap();
        install(&mut admin, cluster.port(), &toml).await;
    }
    let proxy = Proxy::start(cluster.port(), &toml).await;
    let write = "UPDATE sweep_state SET note = 'x' WHERE id = 1";
    let s = connect(proxy.port(), &fenced_db, "").await;
    assert_eq!(code(&s.execute(write, &[]).await), "PF002");
    let s = connect(proxy.port(), &other_db, "").await;
    assert_eq!(code(&s.execute(write, &[]).await), "ok");
}

/// A text of more than 256 KiB is analysed away from the session's thread before it is
/// dispatched: it is fenced as a short one is, in both protocols, also when the write
/// comes after many other statements. The control: straight to Postgres the stale writes
/// land.
#[tokio::test]
async fn long_texts_are_fenced_as_short_ones_are() {
    let f = Fixture::new().await;
    let e1 = f.takeover("node-a").await;
    let a = f.leader(e1).await;
    let e2 = f.takeover("node-b").await;
    let b = f.leader(e2).await;
    let direct = f.direct().await;
    let long_write = |note: &str| {
        format!(
            "UPDATE sweep_state SET note = '{note}' WHERE id = 1 AND note <> '{}'",
            "x".repeat(300_000)
        )
    };
    let behind_reads = |note: &str| {
        format!(
            "{}UPDATE sweep_state SET note = '{note}' WHERE id = 1",
            "SELECT note FROM sweep_state WHERE id = 1;".repeat(8_000)
        )
    };
    for (i, text) in [long_write("s1"), behind_reads("s2")].iter().enumerate() {
        assert!(text.len() > 300_000);
        // The stale leader: refused in both protocols, the row untouched.
        let before = f.note().await;
        assert_eq!(code(&a.batch_execute(text).await), "PF001", "text {i}, simple");
        if i == 0 {
            assert_eq!(
                code(&a.execute(text.as_str(), &[]).await),
                "PF001",
                "text {i}, extended"
            );
        }
        assert_eq!(f.note().await, before, "text {i}");
        // The current leader writes.
        b.batch_execute(&text.replace("'s", "'b")).await.unwrap();
        assert_eq!(f.note().await.0, format!("b{}", i + 1));
        // Control: the same stale text straight to Postgres lands.
        direct.batch_execute(text).await.unwrap();
        assert_eq!(
            f.note().await.0,
            format!("s{}", i + 1),
            "the control must show the corruption"
        );
    }
}
