//! A singleton job on N replicas: every replica runs this program, the lease elects one leader,
//! and only the leader sweeps due invoices, through pgfence, declaring its epoch. A replica that
//! steps down (or is refused with PF001 because it was paused past its lease) stops sweeping and
//! goes back to waiting for the lease.
//!
//! Needs a running pgfence in front of a database with the schema of
//! `docker/initdb/01-schema.sql` and a fence like `docker/pgfence.toml`'s (`pgfence init
//! --config` run there). The compose stack (`docker/compose.yaml`) runs two replicas of it.
//!
//! ```text
//! PGFENCE_URL=postgres://app:app@127.0.0.1:6432/app SWEEPER_ID=a cargo run --example invoice_sweeper
//! ```
//!
//! Environment (or the first argument for the URL):
//! - `PGFENCE_URL`: the connection string, pointing at pgfence (default
//!   `postgres://postgres@127.0.0.1:6432/app`). The lease is taken over the same address.
//! - `SWEEPER_ID`: this replica's name in the lease's `holder` column (default `sweeper-<pid>`).
//! - `LEASE_SECONDS`: the lease (default 15: renew every 5 s, give up after 10 s).
//! - `SWEEP_SECONDS`: how often the leader sweeps (default 2).

use std::time::Duration;

use anyhow::Context;
use pgfence::fence::epoch::Epoch;
use pgfence::lease::{Elector, Leadership};
use tokio_postgres::{Client, Config, NoTls};

/// The lease row, and the fence's name in `pgfence.toml`.
const JOB: &str = "invoice-sweeper";
/// Invoices sent per sweep, each sweep one transaction.
const BATCH: i64 = 10;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PGFENCE_URL").ok())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:6432/app".into());
    let pg: Config = url.parse().context("PGFENCE_URL is not a valid connection string")?;
    let id = std::env::var("SWEEPER_ID").unwrap_or_else(|_| format!("sweeper-{}", std::process::id()));
    let lease = Duration::from_secs_f64(env_number("LEASE_SECONDS", 15.0)?);
    let every = Duration::from_secs_f64(env_number("SWEEP_SECONDS", 2.0)?);
    let elector = Elector::new(JOB, id.clone()).lease(lease);

    println!(
        "{id}: waiting for the lease {JOB:?} (lease {lease:?}, tick {:?})",
        elector.tick()
    );
    loop {
        let leadership = match elector.lead(&pg).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{id}: cannot reach the database: {e}; retrying");
                tokio::time::sleep(elector.tick()).await;
                continue;
            }
        };
        println!("{id}: leading with epoch {}", leadership.epoch);
        if let Err(e) = sweep_while_leading(&pg, &id, &leadership, every).await {
            eprintln!("{id}: sweeping failed: {e:#}");
        }
        match leadership.step_down_reason() {
            Some(why) => println!("{id}: stepped down ({why:?}); waiting for the lease again"),
            None => println!("{id}: stopping work; releasing the lease"),
        }
        leadership.release().await;
    }
}

/// Sweeps every `every` until the leadership ends or pgfence refuses the epoch.
async fn sweep_while_leading(pg: &Config, id: &str, leadership: &Leadership, every: Duration) -> anyhow::Result<()> {
    let mut client = connect_declaring(pg, leadership.epoch).await?;
    let mut ticks = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = leadership.token.cancelled() => return Ok(()),
            _ = ticks.tick() => {}
        }
        match sweep(&mut client, id, leadership.epoch).await {
            Ok(0) => println!("{id}: epoch {}: nothing due", leadership.epoch),
            Ok(n) => println!("{id}: epoch {}: sent {n} invoices", leadership.epoch),
            Err(e) if e.code().is_some_and(|c| c.code() == "PF001") => {
                // A newer leader exists: we were paused or partitioned past our lease. Nothing of
                // this sweep was committed; stop at once.
                let why = e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |db| db.message().to_owned());
                println!(
                    "{id}: epoch {} is stale, another replica took over: {why}",
                    leadership.epoch
                );
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A connection through pgfence that declares `epoch` at startup (`options=-c pgfence.epoch=N`),
/// keeping whatever options the URL already had.
async fn connect_declaring(pg: &Config, epoch: Epoch) -> anyhow::Result<Client> {
    let mut pg = pg.clone();
    let options = match pg.get_options() {
        Some(existing) if !existing.is_empty() => format!("{existing} -c pgfence.epoch={epoch}"),
        _ => format!("-c pgfence.epoch={epoch}"),
    };
    pg.options(&options);
    let (client, connection) = pg.connect(NoTls).await.context("cannot connect to pgfence")?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("connection ended: {e}");
        }
    });
    Ok(client)
}

/// One sweep, one transaction: send a batch of due invoices and record who swept. pgfence checks
/// the epoch inside this transaction, so either all of it commits under the current epoch or
/// none of it does.
async fn sweep(client: &mut Client, id: &str, epoch: Epoch) -> Result<u64, tokio_postgres::Error> {
    let epoch = epoch.as_i64();
    let tx = client.transaction().await?;
    let sent = tx
        .execute(
            "UPDATE invoices SET status = 'sent', sent_epoch = $1 WHERE id IN \
               (SELECT id FROM invoices WHERE status = 'due' ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)",
            &[&epoch, &BATCH],
        )
        .await?;
    let note = format!("swept by {id} at epoch {epoch}");
    tx.execute(
        "UPDATE sweep_state SET note = $1, last_epoch = $2 WHERE id = 1",
        &[&note, &epoch],
    )
    .await?;
    tx.commit().await?;
    Ok(sent)
}

fn env_number(name: &str, default: f64) -> anyhow::Result<f64> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .with_context(|| format!("{name}={v:?}: expected a positive number of seconds")),
    }
}
