//! The workload's tables, the fence that protects them, and the snapshot the checker reads.
//!
//! Every fenced write transaction also inserts one `events` row `(op_id, worker, epoch, kind)`,
//! so the database itself records which attempts committed, with which declared epoch; the
//! commit order comes from `pg_xact_commit_timestamp(xmin)` of those rows (the cluster runs
//! with `track_commit_timestamp = on`). Takeovers are recorded the same way, by a trigger on
//! the lease table that appends to `lease_history` in the acquiring transaction.
//!
//! The rewrite-mode fence protects `rw_rows`, whose rows carry their epoch in `last_epoch`.
//! Its writes have no `events` row (their transaction would then also touch a reject-mode
//! table, and PF001 would stop a stale one before the row predicate mattered); instead a
//! trigger logs every change of a row (old and new epoch, the op id the write stamped) to
//! the unfenced `rw_log`, in the writing transaction.

use std::collections::BTreeMap;

use tokio_postgres::Client;

use super::history::{Event, Grant, Kind, RowChange, Snapshot};

/// The lease row the workers elect on; also the fence's name.
pub const LEASE_ROW: &str = "jepsen";

/// The rewrite-mode fence; it shares the lease row with the reject-mode one.
pub const ROWS_FENCE: &str = "jepsen_rows";
/// Rows of `rw_rows` (few, so that a stale writer's row was likely written by the new leader).
pub const ROWS: i32 = 3;

/// How the fenced tables are protected in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Writers go through pgfence, with both fences: reject mode (a durable HWM, PF001) on
    /// `counter`, `items` and `events`, rewrite mode (`last_epoch <= N` per row) on `rw_rows`.
    Fenced,
    /// The control: writers go straight to Postgres, nothing is fenced.
    Direct,
}

/// Tables, the lease row and the takeover history. The same for the control, so both runs
/// produce the same kind of snapshot.
pub const SCHEMA: &str = "
CREATE TABLE leader_lease (
  name text PRIMARY KEY, holder text, epoch bigint NOT NULL DEFAULT 0,
  expires_at timestamptz NOT NULL DEFAULT '-infinity');
INSERT INTO leader_lease (name) VALUES ('jepsen');
CREATE TABLE counter (id int PRIMARY KEY, v bigint NOT NULL);
INSERT INTO counter VALUES (1, 0);
CREATE TABLE items (op_id bigint NOT NULL, n int NOT NULL, epoch bigint NOT NULL, PRIMARY KEY (op_id, n));
CREATE TABLE events (op_id bigint PRIMARY KEY, worker text NOT NULL, epoch bigint NOT NULL, kind text NOT NULL);
CREATE TABLE lease_history (epoch bigint NOT NULL, holder text);
CREATE TABLE rw_rows (id int PRIMARY KEY, v bigint NOT NULL, last_epoch bigint NOT NULL DEFAULT 0, last_op bigint);
INSERT INTO rw_rows (id, v) SELECT g, 0 FROM generate_series(1, 3) g;
CREATE TABLE rw_log (op_id bigint, id int NOT NULL, old_epoch bigint NOT NULL, new_epoch bigint NOT NULL);
CREATE FUNCTION record_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO rw_log VALUES (NEW.last_op, NEW.id, OLD.last_epoch, NEW.last_epoch);
  RETURN NULL;
END $$;
CREATE TRIGGER record_row AFTER UPDATE ON rw_rows FOR EACH ROW EXECUTE FUNCTION record_row();
CREATE FUNCTION record_grant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO lease_history VALUES (NEW.epoch, NEW.holder);
  RETURN NULL;
END $$;
-- AFTER, so it sees the epoch pgfence's BEFORE trigger settled on.
CREATE TRIGGER record_grant AFTER UPDATE ON leader_lease FOR EACH ROW
  WHEN (NEW.epoch IS DISTINCT FROM OLD.epoch) EXECUTE FUNCTION record_grant();
";

/// The `[[fence]]` section for `target` (empty for the control).
pub fn fence_toml(target: Target) -> String {
    match target {
        Target::Fenced => format!(
            "[[fence]]\nname = \"{LEASE_ROW}\"\nmode = \"reject\"\n\
             tables = [\"public.counter\", \"public.items\", \"public.events\"]\n\
             [fence.lease]\ntable = \"public.leader_lease\"\nrow = \"{LEASE_ROW}\"\n\
             [[fence]]\nname = \"{ROWS_FENCE}\"\nmode = \"rewrite\"\nepoch_column = \"last_epoch\"\n\
             tables = [\"public.rw_rows\"]\n\
             [fence.lease]\ntable = \"public.leader_lease\"\nrow = \"{LEASE_ROW}\"\n"
        ),
        Target::Direct => String::new(),
    }
}

/// Reads the snapshot the checker needs, on a direct connection.
pub async fn snapshot(client: &Client) -> Result<Snapshot, tokio_postgres::Error> {
    const US: &str = "(extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::bigint";
    let events = client
        .query(&format!("SELECT op_id, worker, epoch, kind, {US} FROM events"), &[])
        .await?
        .iter()
        .map(|r| Event {
            op: r.get(0),
            worker: r.get(1),
            epoch: r.get(2),
            kind: Kind::parse(r.get(3)).expect("events.kind is incr or insert"),
            commit_us: r.get(4),
        })
        .collect();
    let grants = client
        .query(&format!("SELECT epoch, holder, {US} FROM lease_history"), &[])
        .await?
        .iter()
        .map(|r| Grant {
            epoch: r.get(0),
            holder: r.get(1),
            commit_us: r.get(2),
        })
        .collect();
    let counter = client
        .query_one("SELECT v FROM counter WHERE id = 1", &[])
        .await?
        .get(0);
    let items: BTreeMap<i64, i64> = client
        .query("SELECT op_id, count(*) FROM items GROUP BY op_id", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let row_changes = client
        .query(
            &format!("SELECT op_id, id, old_epoch, new_epoch, {US} FROM rw_log"),
            &[],
        )
        .await?
        .iter()
        .map(|r| RowChange {
            op: r.get::<_, Option<i64>>(0).unwrap_or(0),
            row: r.get(1),
            old_epoch: r.get(2),
            new_epoch: r.get(3),
            commit_us: r.get(4),
        })
        .collect();
    let row_sum = client
        .query_one("SELECT coalesce(sum(v), 0)::bigint FROM rw_rows", &[])
        .await?
        .get(0);
    Ok(Snapshot {
        events,
        grants,
        counter,
        items,
        row_changes,
        row_sum,
    })
}
