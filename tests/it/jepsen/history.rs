//! What the workload observes, on both sides: the records workers append to their history
//! files (one JSON object a line, written before the next operation starts, so a paused or
//! killed worker loses at most the operation it was in), and the database snapshot taken at
//! the end.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One line of a worker's history file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// The worker's acquire returned `epoch`: it believes it leads from now on.
    Lease { worker: String, epoch: i64 },
    /// One attempted fenced write transaction, as the client saw it end.
    Write(Write),
}

/// What a fenced write transaction changes, so the checker knows what to look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Adds 1 to the counter row (and one `events` row).
    Incr,
    /// Inserts `rows` rows into `items` (and one `events` row).
    Insert,
    /// Bumps one row of the rewrite-mode table `rw_rows` and stamps it with the epoch and the
    /// op id, in a transaction of its own (no `events` row: the row and its change log are
    /// the evidence). `rows` is what the client saw change: 1, or 0 when the row carried a
    /// newer epoch.
    Row,
}

impl Kind {
    /// The `kind` column of `events`, read back.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "incr" => Some(Kind::Incr),
            "insert" => Some(Kind::Insert),
            _ => None,
        }
    }
}

/// How an attempt ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The commit was acknowledged: it must be in the database.
    Ok,
    /// An ERROR (not FATAL) ended the transaction: it must have left nothing behind.
    Rejected,
    /// The connection broke, a FATAL arrived, or the client gave up waiting: either is allowed.
    Unknown,
}

/// One attempted fenced write transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Write {
    /// Who sent it.
    pub worker: String,
    /// The epoch the session had declared.
    pub epoch: i64,
    /// Unique across the run; the `op_id` of its `events` row and `items` rows.
    pub op: i64,
    /// What it changes.
    pub kind: Kind,
    /// `items` rows it inserts (0 for [`Kind::Incr`]); for [`Kind::Row`], the rows the client
    /// saw change (meaningful for [`Outcome::Ok`] only).
    pub rows: i64,
    /// How it was sent (`rmw`, `multi`, `insert_tx`, `pipeline`, `prepared`), for the figures.
    pub style: String,
    /// Which endpoint it went through (`proxy-a`, `relay`, `direct`, …), for the figures.
    pub via: String,
    /// How it ended.
    pub outcome: Outcome,
    /// The SQLSTATE of the error, if there was one.
    pub sqlstate: Option<String>,
}

/// Reads every history file in `paths`; a torn last line (a worker killed mid-write) is skipped.
pub fn read_histories(paths: &[impl AsRef<Path>]) -> std::io::Result<Vec<Record>> {
    let mut records = Vec::new();
    for path in paths {
        let file = std::fs::File::open(path)?;
        for line in BufReader::new(file).lines() {
            if let Ok(record) = serde_json::from_str(&line?) {
                records.push(record);
            }
        }
    }
    Ok(records)
}

/// A committed fenced write: a row of `events` and the commit time of its transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub op: i64,
    pub worker: String,
    pub epoch: i64,
    pub kind: Kind,
    /// `pg_xact_commit_timestamp(xmin)` in microseconds since the Unix epoch.
    pub commit_us: i64,
}

/// A committed change of the lease row's epoch (a row of `lease_history`, filled by a trigger).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub epoch: i64,
    pub holder: Option<String>,
    /// Commit time of the acquiring transaction, microseconds since the Unix epoch.
    pub commit_us: i64,
}

/// A committed change of a row of the rewrite-mode table (a row of `rw_log`, filled by a
/// trigger in the writing transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowChange {
    /// The op id the write stamped on the row.
    pub op: i64,
    /// Which row.
    pub row: i32,
    /// The row's epoch column before and after.
    pub old_epoch: i64,
    pub new_epoch: i64,
    /// Commit time of the writing transaction, microseconds since the Unix epoch.
    pub commit_us: i64,
}

/// The database at the end of a run, read on a direct connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every committed fenced write, in any order (the checker sorts them).
    pub events: Vec<Event>,
    /// Every takeover, in any order.
    pub grants: Vec<Grant>,
    /// The counter row's value.
    pub counter: i64,
    /// `items` rows per op id.
    pub items: BTreeMap<i64, i64>,
    /// Every committed change of a rewrite-mode row, in any order.
    pub row_changes: Vec<RowChange>,
    /// The sum of the rewrite-mode rows' counters (each change adds 1).
    pub row_sum: i64,
}
