//! A worker: one OS process that elects through [`pgfence::lease`] and, while it leads, writes
//! to the fenced tables on a few connections ([`super::ops`]), recording every attempt.
//!
//! The worker is this very test binary, executed again with `JEPSEN_WORKER` set and a filter
//! that runs only the ignored [`worker_process`] test. That needs no extra binary and no
//! guessing where cargo put one (`CARGO_BIN_EXE_*` exists only for `[[bin]]` targets, and an
//! example's path depends on the profile and target dir), and the worker shares the harness
//! code. A real process is the point: SIGSTOP freezes the whole leader, renewal task and all,
//! exactly like a GC pause or a VM migration, which no in-process simulation does.
//!
//! The parent stops a worker by closing its stdin; the worker then stops writing, releases
//! the lease and exits. If the parent dies, stdin closes too, so no worker outlives a run.

use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgfence::lease::Elector;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::db::LEASE_ROW;
use super::history::Record;
use super::ops::{Conn, Fence};
use crate::common::pg::SUPERUSER;

/// The variable carrying a worker's [`WorkerConfig`] as JSON.
const ENV: &str = "JEPSEN_WORKER";
/// The test that becomes the worker when [`ENV`] is set.
const TEST_NAME: &str = "jepsen::worker::worker_process";

/// Where a writer may connect: a pgfence process, the delaying relay, or (the control) Postgres.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Endpoint {
    pub name: String,
    pub port: u16,
}

/// Everything a worker process needs, passed in [`ENV`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// Unique per run; the lease `holder`.
    pub name: String,
    /// Small and unique per run: the high bits of the worker's op ids.
    pub index: i64,
    pub seed: u64,
    pub db: String,
    /// Postgres itself: the lease is taken on a direct connection, so proxy faults hit the
    /// writes and not the election.
    pub pg_port: u16,
    pub endpoints: Vec<Endpoint>,
    pub lease_ms: u64,
    /// Connections writing concurrently while this worker leads.
    pub writers: usize,
    pub history: PathBuf,
}

/// Starts a worker process with its output going to `log`.
pub fn spawn(config: &WorkerConfig, log: File) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["--ignored", "--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(ENV, serde_json::to_string(config).expect("config serialises"))
        .stdin(Stdio::piped())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
}

#[test]
#[ignore = "a worker process of the jepsen workload: the workload starts it with JEPSEN_WORKER set"]
fn worker_process() {
    let Ok(json) = std::env::var(ENV) else {
        return;
    };
    let config: WorkerConfig = serde_json::from_str(&json).expect("JEPSEN_WORKER is a worker config");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(config));
}

/// Shared by a worker's writer tasks.
pub struct Ctx {
    pub config: WorkerConfig,
    history: Mutex<File>,
    next_op: AtomicI64,
}

impl Ctx {
    /// A new op id, unique across the run: the worker's index in the high bits.
    pub fn next_op(&self) -> i64 {
        ((self.config.index + 1) << 40) | self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    /// Appends one record and hands it to the kernel at once, so a record survives the
    /// process being frozen or killed right after.
    pub fn record(&self, record: &Record) {
        let mut line = serde_json::to_string(record).expect("records serialise");
        line.push('\n');
        let mut file = self.history.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(line.as_bytes()).expect("append to history");
    }
}

async fn run(config: WorkerConfig) {
    let stop = CancellationToken::new();
    let on_eof = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        on_eof.cancel();
    });
    let lease = Duration::from_millis(config.lease_ms);
    let elector = Elector::new(LEASE_ROW, config.name.clone()).lease(lease);
    let mut lease_db = tokio_postgres::Config::new();
    lease_db
        .host("127.0.0.1")
        .port(config.pg_port)
        .user(SUPERUSER)
        .dbname(&config.db)
        .connect_timeout(Duration::from_secs(1));
    let mut rng = StdRng::seed_from_u64(config.seed);
    let ctx = Arc::new(Ctx {
        history: Mutex::new(File::create(&config.history).expect("create history")),
        next_op: AtomicI64::new(0),
        config,
    });
    let mut conns: Vec<Conn> = (0..ctx.config.writers)
        .map(|i| Conn::new(Fence::of_writer(i)))
        .collect();
    while !stop.is_cancelled() {
        let leadership = tokio::select! {
            () = stop.cancelled() => break,
            r = elector.lead(&lease_db) => r,
        };
        let Ok(leadership) = leadership else {
            // Postgres is restarting, or the lease statement failed: try again shortly.
            sleep(elector.tick()).await;
            continue;
        };
        let epoch = leadership.epoch.as_i64();
        ctx.record(&Record::Lease {
            worker: ctx.config.name.clone(),
            epoch,
        });
        // Writers stop when the leader steps down (lease lost, no renewal in time), when its
        // term is over, or when the run ends.
        let term_over = leadership.token.child_token();
        let writers: Vec<_> = conns
            .drain(..)
            .map(|conn| tokio::spawn(conn.write_term(ctx.clone(), epoch, term_over.clone(), rng.random())))
            .collect();
        // Leaders hand over now and then on their own, so takeovers happen without faults too.
        let term = lease.mul_f64(rng.random_range(1.0..4.0));
        tokio::select! {
            () = sleep(term) => {}
            () = stop.cancelled() => {}
            () = term_over.cancelled() => {}
        }
        term_over.cancel();
        for writer in writers {
            conns.push(writer.await.expect("writer task"));
        }
        leadership.release().await;
        // Give a rival the first chance at the vacant lease.
        tokio::select! {
            () = sleep(elector.tick().mul_f64(rng.random_range(1.0..3.0))) => {}
            () = stop.cancelled() => {}
        }
    }
}
