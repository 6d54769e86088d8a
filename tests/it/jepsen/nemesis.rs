//! The nemesis: faults injected one at a time on a timeline drawn from the run's seed.
//!
//! - **pause**: SIGSTOP the current lease holder for longer than its lease, then SIGCONT. The
//!   others take over meanwhile; the frozen leader wakes mid-transaction or right before one,
//!   still believing it leads. This is the fault fencing exists for.
//! - **kill-proxy**: kill -9 one of the two pgfence processes and start it again on the same
//!   port; its sessions break (unknown outcomes) and writers reconnect elsewhere.
//! - **restart-postgres**: an immediate (crash) restart of the database; every session and
//!   lease renewal breaks, and crash recovery must keep the HWM and every acknowledged commit.
//! - **delay**: stall the TCP relay in front of a proxy, so messages arrive seconds late.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::sleep;
use tokio_postgres::Config;

use super::relay::Relay;
use crate::common::pg::{Cluster, SUPERUSER, connect_config};
use crate::common::proxy::ProxyProcess;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Pause,
    KillProxy,
    RestartPostgres,
    Delay,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Pause => "pause",
            Fault::KillProxy => "kill-proxy",
            Fault::RestartPostgres => "restart-postgres",
            Fault::Delay => "delay",
        }
    }
}

/// A pgfence process the nemesis may kill, and the config to start it again with.
pub struct ProxySlot {
    pub toml: String,
    pub process: Option<ProxyProcess>,
}

/// What the nemesis acts on.
pub struct Env {
    pub cluster: Arc<Cluster>,
    pub db: String,
    pub lease: Duration,
    pub proxies: Vec<ProxySlot>,
    pub relay: Relay,
    /// (lease holder name, pid) of every worker process.
    pub workers: Vec<(String, u32)>,
    /// Faults injected so far, per kind.
    pub injected: BTreeMap<Fault, usize>,
}

impl Env {
    /// Injects `fault` and returns once it is over (the paused worker resumed, the proxy or the
    /// database is back). Returns a line for the timeline.
    pub async fn inject(&mut self, fault: Fault, rng: &mut StdRng) -> String {
        let line = match fault {
            Fault::Pause => self.pause(rng).await,
            Fault::KillProxy => self.kill_proxy(rng).await,
            Fault::RestartPostgres => {
                let cluster = self.cluster.clone();
                tokio::task::spawn_blocking(move || cluster.restart_immediate())
                    .await
                    .expect("restart postgres");
                "restarted postgres (immediate)".to_owned()
            }
            Fault::Delay => {
                let stall = Duration::from_millis(rng.random_range(200..2500));
                self.relay.stall(stall);
                sleep(stall).await;
                format!("stalled the relay for {stall:.1?}")
            }
        };
        *self.injected.entry(fault).or_default() += 1;
        line
    }

    /// Freezes the lease holder (or any worker when the lease is vacant) well past its lease.
    async fn pause(&mut self, rng: &mut StdRng) -> String {
        let holder = self.holder().await;
        let (name, pid) = match self.workers.iter().find(|(n, _)| Some(n) == holder.as_ref()) {
            Some(w) => w.clone(),
            None => self.workers[rng.random_range(0..self.workers.len())].clone(),
        };
        let stall = self.lease.mul_f64(rng.random_range(2.0..3.0));
        signal("STOP", pid);
        sleep(stall).await;
        signal("CONT", pid);
        format!("paused {name} (holder: {holder:?}) for {stall:.1?}")
    }

    async fn kill_proxy(&mut self, rng: &mut StdRng) -> String {
        let i = rng.random_range(0..self.proxies.len());
        let down = Duration::from_millis(rng.random_range(100..1500));
        // Dropping a ProxyProcess kills it with SIGKILL.
        drop(self.proxies[i].process.take());
        sleep(down).await;
        let toml = self.proxies[i].toml.clone();
        let process = tokio::task::spawn_blocking(move || ProxyProcess::start(&toml))
            .await
            .expect("restart pgfence");
        self.proxies[i].process = Some(process);
        format!("killed pgfence #{i} (kill -9), restarted after {down:.1?}")
    }

    /// The lease row's holder now, `None` when vacant or unreadable (Postgres restarting).
    async fn holder(&self) -> Option<String> {
        let mut config = Config::new();
        config
            .host_path(self.cluster.socket_dir())
            .port(self.cluster.port())
            .user(SUPERUSER)
            .dbname(&self.db)
            .connect_timeout(Duration::from_secs(2));
        let client = connect_config(&config).await.ok()?;
        let row = client
            .query_opt(
                "SELECT holder FROM leader_lease WHERE name = $1 AND expires_at > now()",
                &[&super::db::LEASE_ROW],
            )
            .await
            .ok()??;
        row.get(0)
    }

    /// Resumes every worker, whatever state the run ended in.
    pub fn resume_all(&self) {
        for (_, pid) in &self.workers {
            signal("CONT", *pid);
        }
    }
}

/// `kill -SIG pid`, through kill(1) as the harness does (no libc, no unsafe).
fn signal(name: &str, pid: u32) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status();
}
