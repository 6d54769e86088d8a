//! The workload's tables, the fence that protects them, and the snapshot the checker reads.
//!
//! Every fenced write transaction also inserts one `events` row `(op_id, worker, epoch, kind)`,
//! so the database itself records which attempts committed, with which declared epoch; the
//! commit order comes from `pg_xact_commit_timestamp(xmin)` of those rows (the cluster runs
//! with `track_commit_timestamp = on`). Takeovers are recorded the same way, by a trigger on
//! the lease table that appends to `lease_history` in the acquiring transaction.

use std::collections::BTreeMap;

use tokio_postgres::Client;

use super::history::{Event, Grant, Kind, Snapshot};

/// The lease row the workers elect on; also the fence's name.
pub const LEASE_ROW: &str = "jepsen";

/// How the fenced tables are protected in a run.
///
/// Rewrite mode slots in here as another variant once it exists: its tables get an epoch
/// column, its [`fence_toml`] says `mode = "rewrite"`, and its invariant is per row (a row's
/// epoch never goes down), so it needs its own table set next to the reject-mode one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Writers go through pgfence; the fence is in reject mode (a durable HWM, PF001).
    Reject,
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
        Target::Reject => format!(
            "[[fence]]\nname = \"{LEASE_ROW}\"\nmode = \"reject\"\n\
             tables = [\"public.counter\", \"public.items\", \"public.events\"]\n\
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
    Ok(Snapshot {
        events,
        grants,
        counter,
        items,
    })
}
