//! The checker can fail: a clean history passes, and each kind of violation, planted in it,
//! is reported.

use super::checker::{Violation, check};
use super::history::{Event, Grant, Kind, Outcome, Record, Snapshot, Write};

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
/// write is rejected, one unknown of b's did commit, another did not.
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
    assert_eq!((s.attempted, s.ok, s.unknown, s.rejected_total()), (7, 4, 2, 1));
    assert_eq!((s.committed, s.unknown_committed, s.takeovers), (5, 1, 2));
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
