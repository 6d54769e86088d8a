//! One run of the workload: a private Postgres with commit timestamps, the fence installed, two
//! pgfence processes (or none, for the control) and a stallable relay, K worker processes, the
//! nemesis for the run's duration, then the snapshot and the checker.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::sleep;

use super::checker::{Report, check};
use super::db::{SCHEMA, Target, fence_toml, snapshot};
use super::history::read_histories;
use super::nemesis::{Env, Fault, ProxySlot};
use super::relay::Relay;
use super::worker::{self, Endpoint, WorkerConfig};
use crate::common::pg::Cluster;
use crate::common::proxy::{ProxyProcess, proxy_toml};
use crate::common::{free_port, unique_temp_dir};

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target: Target,
    pub seed: u64,
    pub duration: Duration,
    pub workers: usize,
    pub writers: usize,
    pub lease: Duration,
    /// The kinds of fault to inject: every other fault is a pause if `Pause` is listed, the
    /// other kinds take turns in between.
    pub faults: Vec<Fault>,
    /// Quiet time between faults, drawn uniformly from this range (seconds).
    pub gap_secs: (f64, f64),
}

/// What a run produced.
pub struct RunResult {
    pub report: Report,
    pub injected: BTreeMap<Fault, usize>,
    /// History files and worker logs; removed by [`RunResult::cleanup`] unless the caller
    /// keeps them as evidence.
    pub dir: PathBuf,
}

impl RunResult {
    /// The figures, as the soak command prints them.
    pub fn summary(&self, plan: &Plan) -> String {
        let s = &self.report.stats;
        let faults: Vec<String> = self.injected.iter().map(|(f, n)| format!("{}={n}", f.name())).collect();
        format!(
            "jepsen {:?} seed={} secs={}: attempted={} ok={} rejected={} {:?} unknown={} (committed {}) \
             committed={} rows: writes={} changed={} untouched={} takeovers={} faults=[{}] styles={:?} violations={}",
            plan.target,
            plan.seed,
            plan.duration.as_secs(),
            s.attempted,
            s.ok,
            s.rejected_total(),
            s.rejected,
            s.unknown,
            s.unknown_committed,
            s.committed,
            s.row_writes,
            s.row_changes,
            s.row_untouched,
            s.takeovers,
            faults.join(" "),
            s.by_style,
            self.report.violations.len()
        )
    }

    pub fn cleanup(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `plan` to the end and checks it.
pub async fn run(plan: &Plan) -> RunResult {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let dir = unique_temp_dir("pgfence-jepsen");
    let cluster = Arc::new(Cluster::start());
    let db = prepare(&cluster, plan.target).await;

    let (proxies, relay, endpoints) = endpoints(&cluster, plan.target).await;
    let mut children = Vec::new();
    let mut workers = Vec::new();
    for index in 0..plan.workers {
        let config = WorkerConfig {
            name: format!("w{index}"),
            index: index as i64,
            seed: rng.random(),
            db: db.clone(),
            pg_port: cluster.port(),
            endpoints: endpoints.clone(),
            lease_ms: plan.lease.as_millis() as u64,
            writers: plan.writers,
            history: dir.join(format!("w{index}.jsonl")),
        };
        let log = std::fs::File::create(dir.join(format!("w{index}.log"))).expect("worker log");
        let child = worker::spawn(&config, log).expect("spawn worker");
        workers.push((config.name.clone(), child.id()));
        children.push((config.history, child));
    }
    let mut env = Env {
        cluster: cluster.clone(),
        db: db.clone(),
        lease: plan.lease,
        proxies,
        relay,
        workers,
        injected: BTreeMap::new(),
    };

    let others: Vec<Fault> = plan.faults.iter().copied().filter(|f| *f != Fault::Pause).collect();
    let turn = rng.random_range(0..others.len().max(1));
    let start = Instant::now();
    for n in 0.. {
        if start.elapsed() >= plan.duration {
            break;
        }
        let (lo, hi) = plan.gap_secs;
        sleep(Duration::from_secs_f64(rng.random_range(lo..hi))).await;
        // Every other fault is a pause when pauses are on: they are what fencing is for. The
        // others take turns from a seeded starting point, so even a short run sees each kind.
        let fault = if others.is_empty() || n % 2 == 0 && plan.faults.contains(&Fault::Pause) {
            Fault::Pause
        } else {
            others[(turn + n / 2) % others.len()]
        };
        let at = start.elapsed().as_secs_f64();
        let line = env.inject(fault, &mut rng).await;
        eprintln!("jepsen [{at:5.1}s] {line}");
    }
    env.resume_all();
    let histories = stop_workers(children).await;

    let admin = cluster.admin(&db).await;
    let snapshot = snapshot(&admin).await.expect("read the snapshot");
    let records = read_histories(&histories).expect("read the histories");
    RunResult {
        report: check(&records, &snapshot),
        injected: env.injected,
        dir,
    }
}

/// Turns on commit timestamps (a restart), creates the database and the schema, installs the
/// fence. Returns the database's name.
async fn prepare(cluster: &Arc<Cluster>, target: Target) -> String {
    cluster
        .admin("postgres")
        .await
        .batch_execute("ALTER SYSTEM SET track_commit_timestamp = on")
        .await
        .expect("enable track_commit_timestamp");
    let restart = cluster.clone();
    tokio::task::spawn_blocking(move || restart.restart_immediate())
        .await
        .expect("restart");
    let db = cluster.fresh_db().await;
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute(SCHEMA).await.expect("schema");
    if target != Target::Direct {
        crate::fencing::install(&mut admin, cluster.port(), &fence_toml(target)).await;
    }
    db
}

/// Two pgfence processes and a relay in front of the first (or, for the control, a relay in
/// front of Postgres), and the endpoints writers choose from.
async fn endpoints(cluster: &Cluster, target: Target) -> (Vec<ProxySlot>, Relay, Vec<Endpoint>) {
    let endpoint = |name: &str, port| Endpoint {
        name: name.into(),
        port,
    };
    if target == Target::Direct {
        let relay = Relay::start(cluster.port()).await;
        let endpoints = vec![endpoint("direct", cluster.port()), endpoint("relay", relay.port())];
        return (Vec::new(), relay, endpoints);
    }
    let mut slots = Vec::new();
    for _ in 0..2 {
        let toml = proxy_toml(free_port(), cluster.port(), &fence_toml(target));
        let start = toml.clone();
        let process = tokio::task::spawn_blocking(move || ProxyProcess::start(&start))
            .await
            .expect("start pgfence");
        slots.push(ProxySlot {
            toml,
            process: Some(process),
        });
    }
    let port = |i: usize| slots[i].process.as_ref().expect("started").port();
    let relay = Relay::start(port(0)).await;
    let endpoints = vec![
        endpoint("proxy-a", port(0)),
        endpoint("proxy-b", port(1)),
        endpoint("relay-a", relay.port()),
    ];
    (slots, relay, endpoints)
}

/// Closes every worker's stdin (its signal to release and exit), waits, kills stragglers.
/// Returns the history files.
async fn stop_workers(children: Vec<(PathBuf, Child)>) -> Vec<PathBuf> {
    let mut histories = Vec::new();
    let mut running = Vec::new();
    for (history, mut child) in children {
        drop(child.stdin.take());
        histories.push(history);
        running.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for mut child in running {
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    histories
}
