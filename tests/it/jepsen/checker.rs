//! The checker: a pure function from (worker histories, database snapshot) to the contract's
//! safety invariants that a run broke. No I/O, so its unit tests (`checker_tests.rs`) can show
//! that each kind of violation is caught.
//!
//! Commit order is the order of `pg_xact_commit_timestamp` of the committing transactions, all
//! stamped by the one server's clock. A transaction that passed the guard holds the fence's
//! advisory lock until after its commit timestamp is taken, and a takeover (or a bump to a
//! higher epoch) takes that lock exclusively before it can commit, so wherever pgfence orders
//! two commits their timestamps are strictly ordered too. Equal timestamps are ordered in the
//! checker's favour (lower epoch first, grant after write): a tie is no evidence of a violation.
//!
//! Rewrite-mode rows have no fence-wide order, only a per-row one: two writes of one row
//! serialise on its row lock (the second re-checks `last_epoch <= N` on the row the first
//! committed), so their commit timestamps order them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::history::{Event, Kind, Outcome, Record, RowChange, Snapshot, Write};

/// A broken invariant, with what it takes to find the evidence in the history files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 1: in commit order, a fenced write committed with a lower epoch than an
    /// earlier one.
    EpochWentDown {
        op: i64,
        epoch: i64,
        after_op: i64,
        after_epoch: i64,
    },
    /// Invariant 1: a fenced write with epoch `epoch` committed after the takeover to
    /// `takeover_epoch` had committed.
    CommitAfterTakeover {
        op: i64,
        epoch: i64,
        takeover_epoch: i64,
        late_by_us: i64,
    },
    /// Invariant 4: the client saw the commit succeed, but it is not in the database.
    AcknowledgedButLost { op: i64 },
    /// Invariant 4: the client saw an error, but the transaction committed.
    RejectedButCommitted { op: i64, sqlstate: Option<String> },
    /// Invariant 4: a transaction left `items` rows behind without its `events` row (or
    /// committed a different number of rows than it inserted).
    PartialTransaction { op: i64, expected: i64, found: i64 },
    /// The lease: one epoch was granted to two holders.
    EpochGrantedTwice { epoch: i64, holders: Vec<Option<String>> },
    /// A write declared an epoch the lease never granted to its worker.
    UngrantedEpoch { op: i64, worker: String, epoch: i64 },
    /// The counter disagrees with the committed increments, or with what the clients saw.
    CounterMismatch {
        counter: i64,
        committed_incrs: i64,
        acked: i64,
        unknown: i64,
    },
    /// A committed write that no worker recorded attempting (the history lost a line).
    UnrecordedCommit { op: i64 },
    /// Invariant 1, rewrite mode: in commit order, a write with epoch `epoch` changed `row`
    /// after a write with the higher `after_epoch` had.
    RowEpochWentDown {
        row: i32,
        op: i64,
        epoch: i64,
        after_op: i64,
        after_epoch: i64,
    },
    /// Invariant 4, rewrite mode: the client was told its write changed no row, but it did.
    UnchangedButChanged { op: i64 },
    /// A rewrite-mode write changed a row more than once, or the rows' counters disagree
    /// with the logged changes.
    RowCountMismatch { op: Option<i64>, expected: i64, found: i64 },
}

/// Figures of a run, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub attempted: usize,
    pub ok: usize,
    /// Rejections per SQLSTATE.
    pub rejected: BTreeMap<String, usize>,
    pub unknown: usize,
    /// `events` rows: committed fenced writes.
    pub committed: usize,
    /// Unknown outcomes that turned out committed.
    pub unknown_committed: usize,
    /// Epoch changes of the lease row.
    pub takeovers: usize,
    /// Attempts per style of sending.
    pub by_style: BTreeMap<String, usize>,
    /// Rewrite mode: attempts, committed row changes, and acknowledged writes that changed
    /// no row (the row carried a newer epoch).
    pub row_writes: usize,
    pub row_changes: usize,
    pub row_untouched: usize,
}

impl Stats {
    /// All rejections, whatever the SQLSTATE.
    pub fn rejected_total(&self) -> usize {
        self.rejected.values().sum()
    }
}

/// What the checker found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub stats: Stats,
}

/// Checks every invariant of one fence (all of `snapshot` belongs to one fence).
pub fn check(records: &[Record], snapshot: &Snapshot) -> Report {
    let writes: Vec<&Write> = records
        .iter()
        .filter_map(|r| match r {
            Record::Write(w) => Some(w),
            Record::Lease { .. } => None,
        })
        .collect();
    let attempted: HashMap<i64, &Write> = writes.iter().map(|w| (w.op, *w)).collect();
    let mut violations = Vec::new();
    check_commit_order(snapshot, &mut violations);
    check_grants(records, snapshot, &writes, &mut violations);
    check_outcomes(&writes, &attempted, snapshot, &mut violations);
    check_counter(&writes, snapshot, &mut violations);
    check_rows(&writes, &attempted, snapshot, &mut violations);
    Report {
        violations,
        stats: stats(&writes, snapshot),
    }
}

/// Invariant 1: epochs never go down in commit order, and nothing older commits after a
/// takeover.
fn check_commit_order(snapshot: &Snapshot, out: &mut Vec<Violation>) {
    let mut events: Vec<&Event> = snapshot.events.iter().collect();
    events.sort_by_key(|e| (e.commit_us, e.epoch, e.op));
    let mut grants: Vec<(i64, i64)> = snapshot.grants.iter().map(|g| (g.commit_us, g.epoch)).collect();
    grants.sort_unstable();

    let mut highest: Option<&Event> = None;
    let mut granted = 0; // grants[..granted] committed strictly before the current event
    let mut takeover: Option<(i64, i64)> = None; // (epoch, commit_us) of the highest such grant
    for event in events {
        if let Some(top) = highest
            && event.epoch < top.epoch
        {
            out.push(Violation::EpochWentDown {
                op: event.op,
                epoch: event.epoch,
                after_op: top.op,
                after_epoch: top.epoch,
            });
        }
        if highest.is_none_or(|top| event.epoch > top.epoch) {
            highest = Some(event);
        }
        while granted < grants.len() && grants[granted].0 < event.commit_us {
            let (at, epoch) = grants[granted];
            if takeover.is_none_or(|(e, _)| epoch > e) {
                takeover = Some((epoch, at));
            }
            granted += 1;
        }
        if let Some((epoch, at)) = takeover
            && event.epoch < epoch
        {
            out.push(Violation::CommitAfterTakeover {
                op: event.op,
                epoch: event.epoch,
                takeover_epoch: epoch,
                late_by_us: event.commit_us - at,
            });
        }
    }
}

/// Each epoch has one holder, and every write declared an epoch granted to its own worker.
fn check_grants(records: &[Record], snapshot: &Snapshot, writes: &[&Write], out: &mut Vec<Violation>) {
    let mut holders: BTreeMap<i64, BTreeSet<Option<String>>> = BTreeMap::new();
    for g in &snapshot.grants {
        holders.entry(g.epoch).or_default().insert(g.holder.clone());
    }
    // What the workers believe they were granted counts too: two workers holding one epoch is
    // a split brain even if the lease table says otherwise.
    for r in records {
        if let Record::Lease { worker, epoch } = r {
            holders.entry(*epoch).or_default().insert(Some(worker.clone()));
        }
    }
    for (epoch, set) in &holders {
        if set.len() > 1 {
            out.push(Violation::EpochGrantedTwice {
                epoch: *epoch,
                holders: set.iter().cloned().collect(),
            });
        }
    }
    for w in writes {
        let granted = snapshot
            .grants
            .iter()
            .any(|g| g.epoch == w.epoch && g.holder.as_deref() == Some(&w.worker));
        if !granted {
            out.push(Violation::UngrantedEpoch {
                op: w.op,
                worker: w.worker.clone(),
                epoch: w.epoch,
            });
        }
    }
}

/// Invariant 4: acknowledged writes are there, rejected ones left nothing, transactions are
/// whole.
fn check_outcomes(writes: &[&Write], attempted: &HashMap<i64, &Write>, snapshot: &Snapshot, out: &mut Vec<Violation>) {
    let committed: HashMap<i64, &Event> = snapshot.events.iter().map(|e| (e.op, e)).collect();
    for w in writes.iter().filter(|w| w.kind != Kind::Row) {
        let present = committed.contains_key(&w.op);
        match (w.outcome, present) {
            (Outcome::Ok, false) => out.push(Violation::AcknowledgedButLost { op: w.op }),
            (Outcome::Rejected, true) => out.push(Violation::RejectedButCommitted {
                op: w.op,
                sqlstate: w.sqlstate.clone(),
            }),
            _ => {}
        }
        let found = snapshot.items.get(&w.op).copied().unwrap_or(0);
        let expected = if present { w.rows } else { 0 };
        if found != expected {
            out.push(Violation::PartialTransaction {
                op: w.op,
                expected,
                found,
            });
        }
    }
    for e in &snapshot.events {
        if !attempted.contains_key(&e.op) {
            out.push(Violation::UnrecordedCommit { op: e.op });
        }
    }
    for (op, found) in &snapshot.items {
        if !attempted.contains_key(op) {
            out.push(Violation::PartialTransaction {
                op: *op,
                expected: 0,
                found: *found,
            });
        }
    }
}

/// Rewrite mode, per row: in commit order a row's epoch never goes down; what the clients were
/// told matches the changes logged; each change adds 1 to its row's counter.
fn check_rows(writes: &[&Write], attempted: &HashMap<i64, &Write>, snapshot: &Snapshot, out: &mut Vec<Violation>) {
    let mut changes: Vec<&RowChange> = snapshot.row_changes.iter().collect();
    changes.sort_by_key(|c| (c.row, c.commit_us, c.new_epoch, c.op));
    let mut top: Option<&RowChange> = None;
    for c in changes {
        if top.is_some_and(|t| t.row != c.row) {
            top = None;
        }
        if let Some(t) = top
            && c.new_epoch < t.new_epoch
        {
            out.push(Violation::RowEpochWentDown {
                row: c.row,
                op: c.op,
                epoch: c.new_epoch,
                after_op: t.op,
                after_epoch: t.new_epoch,
            });
        }
        if top.is_none_or(|t| c.new_epoch > t.new_epoch) {
            top = Some(c);
        }
    }

    let mut per_op: HashMap<i64, i64> = HashMap::new();
    for c in &snapshot.row_changes {
        *per_op.entry(c.op).or_default() += 1;
    }
    for w in writes.iter().filter(|w| w.kind == Kind::Row) {
        let found = per_op.get(&w.op).copied().unwrap_or(0);
        match w.outcome {
            Outcome::Ok if w.rows > 0 && found == 0 => out.push(Violation::AcknowledgedButLost { op: w.op }),
            Outcome::Ok if w.rows == 0 && found > 0 => out.push(Violation::UnchangedButChanged { op: w.op }),
            Outcome::Rejected if found > 0 => out.push(Violation::RejectedButCommitted {
                op: w.op,
                sqlstate: w.sqlstate.clone(),
            }),
            _ => {}
        }
        if found > 1 {
            out.push(Violation::RowCountMismatch {
                op: Some(w.op),
                expected: 1,
                found,
            });
        }
    }
    for op in per_op.keys() {
        if attempted.get(op).is_none_or(|w| w.kind != Kind::Row) {
            out.push(Violation::UnrecordedCommit { op: *op });
        }
    }
    let logged = snapshot.row_changes.len() as i64;
    if snapshot.row_sum != logged {
        out.push(Violation::RowCountMismatch {
            op: None,
            expected: logged,
            found: snapshot.row_sum,
        });
    }
}

/// The counter equals the committed increments, which lie between the acknowledged ones and
/// the acknowledged plus the unknown ones.
fn check_counter(writes: &[&Write], snapshot: &Snapshot, out: &mut Vec<Violation>) {
    let count = |o: Outcome| writes.iter().filter(|w| w.kind == Kind::Incr && w.outcome == o).count() as i64;
    let (acked, unknown) = (count(Outcome::Ok), count(Outcome::Unknown));
    let committed_incrs = snapshot.events.iter().filter(|e| e.kind == Kind::Incr).count() as i64;
    let c = snapshot.counter;
    if c != committed_incrs || c < acked || c > acked + unknown {
        out.push(Violation::CounterMismatch {
            counter: c,
            committed_incrs,
            acked,
            unknown,
        });
    }
}

fn stats(writes: &[&Write], snapshot: &Snapshot) -> Stats {
    let committed: BTreeSet<i64> = snapshot
        .events
        .iter()
        .map(|e| e.op)
        .chain(snapshot.row_changes.iter().map(|c| c.op))
        .collect();
    let mut stats = Stats {
        attempted: writes.len(),
        committed: snapshot.events.len(),
        takeovers: snapshot.grants.len(),
        row_changes: snapshot.row_changes.len(),
        ..Stats::default()
    };
    for w in writes {
        *stats.by_style.entry(w.style.clone()).or_default() += 1;
        if w.kind == Kind::Row {
            stats.row_writes += 1;
            stats.row_untouched += usize::from(w.outcome == Outcome::Ok && w.rows == 0);
        }
        match w.outcome {
            Outcome::Ok => stats.ok += 1,
            Outcome::Rejected => {
                let code = w.sqlstate.clone().unwrap_or_else(|| "none".into());
                *stats.rejected.entry(code).or_default() += 1;
            }
            Outcome::Unknown => {
                stats.unknown += 1;
                stats.unknown_committed += usize::from(committed.contains(&w.op));
            }
        }
    }
    stats
}
