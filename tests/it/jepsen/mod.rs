//! A Jepsen-style stale-writer test: leaders elected with a short lease write through two
//! pgfence processes while a nemesis freezes leaders past their lease, kills proxies, crashes
//! Postgres and stalls the network; a checker then holds the database and the clients'
//! histories to the contract's safety invariants. The same workload straight to Postgres is
//! the control: there the checker must find violations, or it proves nothing.
//!
//! - [`worker`]: the worker process (this test binary, executed again).
//! - [`ops`]: the fenced write transactions, in every protocol shape.
//! - [`nemesis`] and [`relay`]: the faults.
//! - [`db`]: tables, fence config, the snapshot. [`history`]: what both sides record.
//! - [`checker`]: the invariants, a pure function (unit tests in `checker_tests`).
//! - [`run`]: one run, start to verdict.
//!
//! Knobs (environment): `JEPSEN_SEED` replays a run's fault timeline and worker choices (the
//! seed is printed; timing still varies), `JEPSEN_SECS` sets the duration of the run through
//! pgfence (default 40), `JEPSEN_WORKERS` the number of worker processes (default 3). The soak
//! command is in `docs/TESTING.md`.

mod checker;
#[cfg(test)]
mod checker_tests;
mod db;
mod history;
mod nemesis;
mod ops;
mod relay;
mod run;
mod worker;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use db::Target;
use nemesis::Fault;
use run::{Plan, run};

/// Short, so that a run sees many takeovers: tick 0.5 s, a leader gives up after 1 s.
const LEASE: Duration = Duration::from_millis(1500);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// `JEPSEN_SEED`, else a fresh one.
fn seed() -> u64 {
    env_u64("JEPSEN_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    })
}

fn workers() -> usize {
    env_u64("JEPSEN_WORKERS").map_or(3, |n| n.max(2) as usize)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_writers_under_faults_never_commit_through_pgfence() {
    let plan = Plan {
        target: Target::Fenced,
        seed: seed(),
        duration: Duration::from_secs(env_u64("JEPSEN_SECS").unwrap_or(40)),
        workers: workers(),
        writers: 3,
        lease: LEASE,
        // Pauses are the point (every other fault); the others stress what surrounds them.
        faults: vec![Fault::Pause, Fault::KillProxy, Fault::RestartPostgres, Fault::Delay],
        gap_secs: (1.0, 3.0),
    };
    eprintln!("jepsen: seed {} (replay with JEPSEN_SEED={})", plan.seed, plan.seed);
    let result = run(&plan).await;
    eprintln!("{}", result.summary(&plan));
    let s = &result.report.stats;
    assert!(
        result.report.violations.is_empty(),
        "{} violations (seed {}; histories in {}): {:#?}",
        result.report.violations.len(),
        plan.seed,
        result.dir.display(),
        result.report.violations
    );
    assert!(
        s.committed >= 100 && s.row_changes >= 30 && s.takeovers >= 3 && result.injected.get(&Fault::Pause) > Some(&0),
        "the workload barely ran (seed {}; logs in {}): {}",
        plan.seed,
        result.dir.display(),
        result.summary(&plan)
    );
    result.cleanup();
}

/// The control: the same workload and the same pauses, straight to Postgres. Without a fence
/// the frozen leader's writes land after the takeover, and the checker must say so, for the
/// reject-mode tables and for the rewrite-mode rows alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_pgfence_the_checker_finds_stale_commits() {
    let plan = Plan {
        target: Target::Direct,
        seed: seed() ^ 0x5eed,
        // Still shorter than the run through pgfence, so in CI it costs no wall time.
        duration: Duration::from_secs(25),
        workers: workers(),
        writers: 3,
        lease: LEASE,
        faults: vec![Fault::Pause],
        gap_secs: (0.5, 1.5),
    };
    eprintln!("jepsen control: seed {}", plan.seed);
    let result = run(&plan).await;
    eprintln!("{}", result.summary(&plan));
    let count = |row_level: bool| {
        result
            .report
            .violations
            .iter()
            .filter(|v| match v {
                checker::Violation::CommitAfterTakeover { .. } | checker::Violation::EpochWentDown { .. } => !row_level,
                checker::Violation::RowEpochWentDown { .. } => row_level,
                _ => false,
            })
            .count()
    };
    let (stale, stale_rows) = (count(false), count(true));
    assert!(
        stale > 0 && stale_rows > 0,
        "the control found {stale} stale commits and {stale_rows} rows overwritten by a stale epoch; \
         with none the checker proves nothing (seed {}; logs in {}): {:#?}",
        plan.seed,
        result.dir.display(),
        result.report.violations
    );
    result.cleanup();
}
