//! The checker can fail: a clean history passes, and each kind of violation, planted in it,
//! is reported.

use super::checker::{Violation, check};
use super::history::{Event, Grant, Kind, Outcome, Record, RowChange, Snapshot, Write};

fn write(worker: &str, epoch: i64, op: i64, kind: Kind, outcome: Outcome) -> Record {
    Record::Write(Write {
        worker: worker.into(),
        epoch,
        op,
        kind,
        rows: if kind == Kind::Insert { 2 } else { 0 },
        style: "rmw".into(),
        via: "proxy-a".into(),
        outcome,
        sqlstate: (outcome == Outcome::Rejected).then(|| "PF001".into()),
    })
}

/// A rewrite-mode write the client saw change `rows` rows.
fn row_write(worker: &str, epoch: i64, op: i64, rows: i64, outcome: Outcome) -> Record {
    Record::Write(Write {
        worker: worker.into(),
        epoch,
        op,
        kind: Kind::Row,
        rows,
        style: "row_update".into(),
        via: "proxy-b".into(),
        outcome,
        sqlstate: None,
    })
}

fn change(op: i64, row: i32, old_epoch: i64, new_epoch: i64, commit_us: i64) -> RowChange {
    RowChange {
        op,
        row,
        old_epoch,
        new_epoch,
        commit_us,
    }
}

fn event(worker: &str, epoch: i64, op: i64, kind: Kind, commit_us: i64) -> Event {
    Event {
        op,
        worker: worker.into(),
        epoch,
        kind,
        commit_us,
    }
}

fn grant(epoch: i64, holder: &str, commit_us: i64) -> Grant {
    Grant {
        epoch,
        holder: Some(holder.into()),
        commit_us,
    }
}

/// a leads at 1 (two increments and an insert), b takes over at 2 and increments; a's late
/// write is rejected, one unknown of b's did commit, another did not. In rewrite mode a and
/// b each change row 1; a's late write of row 1 changes nothing, its late write of row 2
/// (which epoch 2 never wrote) lands, as the row-level design allows.
fn clean() -> (Vec<Record>, Snapshot) {
    let records = vec![
        Record::Lease {
            worker: "a".into(),
            epoch: 1,
        },
        write("a", 1, 1, Kind::Incr, Outcome::Ok),
        write("a", 1, 2, Kind::Insert, Outcome::Ok),
        write("a", 1, 3, Kind::Incr, Outcome::Ok),
        Record::Lease {
            worker: "b".into(),
            epoch: 2,
        },
        write("a", 1, 4, Kind::Incr, Outcome::Rejected),
        write("b", 2, 5, Kind::Incr, Outcome::Ok),
        write("b", 2, 6, Kind::Incr, Outcome::Unknown),
        write("b", 2, 7, Kind::Insert, Outcome::Unknown),
        row_write("a", 1, 10, 1, Outcome::Ok),
        row_write("b", 2, 11, 1, Outcome::Ok),
        row_write("a", 1, 12, 0, Outcome::Ok),
        row_write("a", 1, 13, 1, Outcome::Ok),
    ];
    let snapshot = Snapshot {
        events: vec![
            event("a", 1, 1, Kind::Incr, 100),
            event("a", 1, 2, Kind::Insert, 110),
            event("a", 1, 3, Kind::Incr, 120),
            event("b", 2, 5, Kind::Incr, 300),
            event("b", 2, 6, Kind::Incr, 310),
        ],
        grants: vec![grant(1, "a", 50), grant(2, "b", 200)],
        counter: 4,
        items: [(2, 2)].into_iter().collect(),
        row_changes: vec![
            change(10, 1, 0, 1, 130),
            change(11, 1, 1, 2, 320),
            change(13, 2, 0, 1, 330),
        ],
        row_sum: 3,
    };
    (records, snapshot)
}

fn violations(records: &[Record], snapshot: &Snapshot) -> Vec<Violation> {
    check(records, snapshot).violations
}

#[test]
fn clean_history_has_no_violations_and_counts_outcomes() {
    let (records, snapshot) = clean();
    let report = check(&records, &snapshot);
    assert_eq!(report.violations, vec![]);
    let s = report.stats;
    assert_eq!((s.attempted, s.ok, s.unknown, s.rejected_total()), (11, 8, 2, 1));
    assert_eq!((s.committed, s.unknown_committed, s.takeovers), (5, 1, 2));
    assert_eq!((s.row_writes, s.row_changes, s.row_untouched), (4, 3, 1));
    assert_eq!(s.rejected.get("PF001"), Some(&1));
}

#[test]
fn stale_commit_after_a_newer_epoch_is_flagged() {
    let (mut records, mut snapshot) = clean();
    // a's write 4 committed after b's write 5 (the control's failure).
    records[5] = write("a", 1, 4, Kind::Incr, Outcome::Ok);
    snapshot.events.push(event("a", 1, 4, Kind::Incr, 305));
    snapshot.counter = 5;
    let v = violations(&records, &snapshot);
    assert!(v.contains(&Violation::EpochWentDown {
        op: 4,
        epoch: 1,
        after_op: 5,
        after_epoch: 2
    }));
    assert!(v.contains(&Violation::CommitAfterTakeover {
        op: 4,
        epoch: 1,
        takeover_epoch: 2,
        late_by_us: 105
    }));
}

#[test]
fn stale_commit_after_a_takeover_is_flagged_before_the_new_leader_writes() {
    let (mut records, mut snapshot) = clean();
    records[5] = write("a", 1, 4, Kind::Incr, Outcome::Ok);
    snapshot.events.push(event("a", 1, 4, Kind::Incr, 250));
    snapshot.counter = 5;
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::CommitAfterTakeover {
            op: 4,
            epoch: 1,
            takeover_epoch: 2,
            late_by_us: 50
        }]
    );
}

#[test]
fn a_tie_in_commit_time_is_no_evidence() {
    let (mut records, mut snapshot) = clean();
    records[5] = write("a", 1, 4, Kind::Incr, Outcome::Ok);
    snapshot.events.push(event("a", 1, 4, Kind::Incr, 200));
    snapshot.events[3].commit_us = 200;
    snapshot.counter = 5;
    assert_eq!(violations(&records, &snapshot), vec![]);
}

#[test]
fn acknowledged_write_missing_from_the_database_is_flagged() {
    let (records, mut snapshot) = clean();
    snapshot.events.retain(|e| e.op != 3);
    snapshot.counter = 3;
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::AcknowledgedButLost { op: 3 }]
    );
}

#[test]
fn rejected_write_present_in_the_database_is_flagged() {
    let (records, mut snapshot) = clean();
    snapshot.events.push(event("a", 1, 4, Kind::Incr, 150));
    snapshot.counter = 5;
    let v = violations(&records, &snapshot);
    assert!(v.contains(&Violation::RejectedButCommitted {
        op: 4,
        sqlstate: Some("PF001".into())
    }));
    assert!(v.iter().any(|v| matches!(v, Violation::CounterMismatch { .. })));
}

#[test]
fn rows_left_behind_by_an_uncommitted_transaction_are_flagged() {
    let (records, mut snapshot) = clean();
    snapshot.items.insert(7, 1);
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::PartialTransaction {
            op: 7,
            expected: 0,
            found: 1
        }]
    );
    let (records, mut snapshot) = clean();
    snapshot.items.insert(2, 1);
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::PartialTransaction {
            op: 2,
            expected: 2,
            found: 1
        }]
    );
}

#[test]
fn one_epoch_granted_to_two_holders_is_flagged() {
    let (mut records, snapshot) = clean();
    records.push(Record::Lease {
        worker: "c".into(),
        epoch: 2,
    });
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::EpochGrantedTwice {
            epoch: 2,
            holders: vec![Some("b".into()), Some("c".into())]
        }]
    );
}

#[test]
fn write_with_an_epoch_not_granted_to_its_worker_is_flagged() {
    let (mut records, snapshot) = clean();
    records.push(write("a", 2, 8, Kind::Incr, Outcome::Rejected));
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::UngrantedEpoch {
            op: 8,
            worker: "a".into(),
            epoch: 2
        }]
    );
}

#[test]
fn counter_that_lost_an_increment_is_flagged() {
    let (records, mut snapshot) = clean();
    snapshot.counter = 3;
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::CounterMismatch {
            counter: 3,
            committed_incrs: 4,
            acked: 3,
            unknown: 1
        }]
    );
}

#[test]
fn commit_nobody_recorded_is_flagged() {
    let (records, mut snapshot) = clean();
    snapshot.events.push(event("b", 2, 99, Kind::Insert, 400));
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::UnrecordedCommit { op: 99 }]
    );
}

#[test]
fn stale_row_write_after_a_newer_epoch_is_flagged() {
    let (mut records, mut snapshot) = clean();
    // a's late write of row 1 overwrote b's epoch 2 (the control's failure in rewrite mode).
    records[11] = row_write("a", 1, 12, 1, Outcome::Ok);
    snapshot.row_changes.push(change(12, 1, 2, 1, 340));
    snapshot.row_sum = 4;
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::RowEpochWentDown {
            row: 1,
            op: 12,
            epoch: 1,
            after_op: 11,
            after_epoch: 2
        }]
    );
}

#[test]
fn a_row_tie_in_commit_time_is_no_evidence() {
    let (mut records, mut snapshot) = clean();
    records[11] = row_write("a", 1, 12, 1, Outcome::Ok);
    snapshot.row_changes.push(change(12, 1, 1, 1, 320));
    snapshot.row_sum = 4;
    assert_eq!(violations(&records, &snapshot), vec![]);
}

#[test]
fn row_write_told_unchanged_that_changed_is_flagged() {
    let (mut records, snapshot) = clean();
    records[12] = row_write("a", 1, 13, 0, Outcome::Ok);
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::UnchangedButChanged { op: 13 }]
    );
}

#[test]
fn acknowledged_row_write_missing_is_flagged() {
    let (records, mut snapshot) = clean();
    snapshot.row_changes.retain(|c| c.op != 11);
    snapshot.row_sum = 2;
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::AcknowledgedButLost { op: 11 }]
    );
}

#[test]
fn row_counters_that_disagree_with_the_log_are_flagged() {
    let (records, mut snapshot) = clean();
    snapshot.row_sum = 4;
    assert_eq!(
        violations(&records, &snapshot),
        vec![Violation::RowCountMismatch {
            op: None,
            expected: 3,
            found: 4
        }]
    );
}
