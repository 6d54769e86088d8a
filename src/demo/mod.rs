//! `pgfence demo`: the whole story in one command.
//!
//! Starts a throwaway Postgres from the installed server binaries (`demo::cluster`), creates the
//! seed's tables (`leader_lease`, `sweep_state`), runs `pgfence init` for a fence on
//! `sweep_state` coupled to the lease, starts the proxy in-process, and tells the story twice
//! (`demo::scenario`): once with the workers writing through pgfence (node-a's stale write is refused
//! with `PF001`), and once, as the control, writing straight to Postgres (node-a's stale write
//! overwrites node-b's). Everything is stopped and removed at the end, on error and on Ctrl-C.
//!
//! Like `main`, this is an edge of the program (it prints and exits), so it reports errors with
//! `anyhow` rather than a library error type.

mod cluster;
mod scenario;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow, bail};
use tokio::signal::unix::{SignalKind, signal};

use self::cluster::Cluster;
use self::scenario::{Outcome, Run, Write};
use crate::config::{Config, RawConfig};
use crate::fence::install::install;
use crate::lease::Elector;
use crate::server::{Server, Shutdown};

/// The fence the demo configures.
pub const FENCE: &str = "invoice-sweeper";
/// The lease row the workers elect on.
pub const LEASE_ROW: &str = "invoice-sweeper";
/// The database pgfence protects.
const DB: &str = "demo";
/// The database of the control run, which the workers reach without pgfence.
const CONTROL_DB: &str = "demo_control";

/// The seed's tables, and the one row the sweepers fight over.
const SCHEMA: &str = "CREATE TABLE sweep_state (id int PRIMARY KEY, note text, last_epoch bigint); \
                      INSERT INTO sweep_state VALUES (1, 'not swept yet', 0)";

/// Runs the demo; prints the story on stdout. Cleans up before returning, whatever happened.
pub async fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    // Installed before anything starts, so a Ctrl-C reaches us (and our cleanup) rather than
    // killing the process half-way.
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let bin_dir = cluster::find_bin_dir()?;
    crate::say!("pgfence demo: fencing tokens on an ordinary Postgres\n");
    crate::say!("starting a throwaway Postgres from {} ...", bin_dir.display());
    let result = tokio::select! {
        r = start_and_showcase(bin_dir) => r,
        _ = interrupt.recv() => Err(anyhow!("interrupted")),
        _ = terminate.recv() => Err(anyhow!("terminated")),
    };
    if result.is_err() {
        // The showcase future has been dropped, and with it the cluster: Postgres is stopped and
        // its directory removed.
        crate::say!("\nstopped: Postgres and its temp dir are gone");
    }
    result?;
    crate::say!("demo finished in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

async fn start_and_showcase(bin_dir: std::path::PathBuf) -> anyhow::Result<()> {
    let mut cluster = Cluster::start(bin_dir).await?;
    let result = showcase(&cluster).await;
    cluster.stop();
    crate::say!(
        "\ncleaned up: stopped Postgres and removed {}",
        cluster.root().display()
    );
    result
}

async fn showcase(cluster: &Cluster) -> anyhow::Result<()> {
    let admin = cluster.admin("postgres").await?;
    let version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
    crate::say!(
        "Postgres {version} is up on 127.0.0.1:{} (temp dir {})",
        cluster.port(),
        cluster.root().display()
    );
    for db in [DB, CONTROL_DB] {
        admin.batch_execute(&format!("CREATE DATABASE {db}")).await?;
        let client = cluster.admin(db).await?;
        let lease = Elector::new(LEASE_ROW, "setup");
        client
            .batch_execute(&format!("{}; {SCHEMA}", lease.create_table_sql()))
            .await?;
        lease.ensure_row(&client).await?;
    }
    crate::say!("created databases {DB} and {CONTROL_DB}, each with tables leader_lease and sweep_state");

    let toml = fence_toml(cluster.port());
    let config = RawConfig::from_toml(&toml)?.validate()?;
    let mut client = cluster.admin(DB).await?;
    let report = install(&mut client, &config.fences).await.context("pgfence init")?;
    crate::say!("\npgfence init, with this configuration:\n\n{}", indent(&toml));
    crate::say_part!("{}", indent(&report.to_string()));

    let (proxy_port, shutdown, server) = start_proxy(config).await?;
    crate::say!(
        "\npgfence is listening on 127.0.0.1:{proxy_port}, in front of 127.0.0.1:{}",
        cluster.port()
    );
    crate::say!(
        "two workers, node-a and node-b, elect a leader on leader_lease (lease {:?}, renewed every {:?}, \
         given up after {:?} without a renewal) and sweep sweep_state while they lead",
        scenario::LEASE,
        scenario::LEASE / 3,
        scenario::LEASE * 2 / 3
    );

    let title = "Run 1: with pgfence (the workers connect to pgfence and declare their epoch)";
    let fenced = scenario::run(&Run {
        title,
        db: DB.into(),
        port: proxy_port,
        fenced: true,
    })
    .await;
    shutdown.fast.cancel();
    let _ = server.await;
    let fenced = fenced?;
    let fenced_note = print_tables(cluster, DB, true).await?;

    let title = "Run 2, the control: the same story without pgfence (the workers connect straight to Postgres)";
    let control = scenario::run(&Run {
        title,
        db: CONTROL_DB.into(),
        port: cluster.port(),
        fenced: false,
    })
    .await?;
    let control_note = print_tables(cluster, CONTROL_DB, false).await?;
    verdict(&fenced, &fenced_note, &control, &control_note)
}

fn fence_toml(upstream_port: u16) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{upstream_port}\"\n\n[[fence]]\nname = \"{FENCE}\"\n\
         database = \"{DB}\"\ntables = [\"public.sweep_state\"]\nmode = \"reject\"\n\n[fence.lease]\n\
         table = \"public.leader_lease\"\nrow = \"{LEASE_ROW}\"\n"
    )
}

/// Binds 127.0.0.1:0 and serves in a task; returns the port, the way to stop it and the task.
async fn start_proxy(config: Config) -> anyhow::Result<(u16, Shutdown, tokio::task::JoinHandle<()>)> {
    let server = Server::bind(Arc::new(config)).await.context("cannot start pgfence")?;
    let port = server.local_addr()?.port();
    let shutdown = Shutdown::default();
    let task = tokio::spawn(server.run(shutdown.clone()));
    Ok((port, shutdown, task))
}

/// Prints `sweep_state` and the lease row of `db`; returns the row's note.
async fn print_tables(cluster: &Cluster, db: &str, fenced: bool) -> anyhow::Result<String> {
    let client = cluster.admin(db).await?;
    crate::say!("\n  final sweep_state in {db}:");
    crate::say!("    id | note                         | last_epoch");
    let mut note = String::new();
    for row in client
        .query("SELECT id, note, last_epoch FROM sweep_state ORDER BY id", &[])
        .await?
    {
        let (id, n, epoch): (i32, String, i64) = (row.get(0), row.get(1), row.get(2));
        crate::say!("    {id:>2} | {n:<28} | {epoch}");
        note = n;
    }
    let lease = client
        .query_one("SELECT holder, epoch FROM leader_lease WHERE name = $1", &[&LEASE_ROW])
        .await?;
    let holder: Option<String> = lease.get(0);
    let epoch: i64 = lease.get(1);
    let holder = holder.unwrap_or_else(|| "nobody (released)".into());
    crate::say!("  leader_lease: epoch {epoch}, holder {holder}");
    if fenced {
        let hwm: i64 = client
            .query_one("SELECT hwm FROM pgfence.fence WHERE name = $1", &[&FENCE])
            .await?
            .get(0);
        crate::say!("  pgfence.fence \"{FENCE}\": high-water mark {hwm}");
    }
    Ok(note)
}

/// The conclusion, with the markers a reader (or a test) looks for. Fails when the fenced run
/// did not refuse the stale write: then pgfence is broken and the demo must say so.
fn verdict(fenced: &Outcome, fenced_note: &str, control: &Outcome, control_note: &str) -> anyhow::Result<()> {
    crate::say!("\n== Verdict ==");
    match &fenced.stale_write {
        Write::Refused { code, .. } if code == "PF001" && fenced_note == fenced.b_note => crate::say!(
            "  with pgfence:    node-a's stale write was REJECTED with PF001; the row keeps node-b's sweep (\"{}\")",
            fenced.b_note
        ),
        other => {
            bail!("with pgfence, node-a's stale write was not refused with PF001 ({other:?}); row: {fenced_note:?}")
        }
    }
    match &control.stale_write {
        Write::Committed(_) if control_note == control.a_note => crate::say!(
            "  without pgfence: CORRUPTED: node-a's stale write overwrote node-b's sweep; the row says \"{}\" \
             although node-b had taken over at epoch {}",
            control.a_note,
            control.b_epoch
        ),
        other => {
            crate::say!(
                "  without pgfence: unexpectedly, the stale write did not land ({other:?}); row: {control_note:?}"
            )
        }
    }
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}
