//! The story the demo tells, run once with pgfence in the path and once without: two workers
//! elect a leader through the lease, the leader is paused past its lease, the other takes over
//! and writes, the old leader wakes and writes with its old epoch.

use std::fmt::Display;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::time::{Instant, sleep};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::LEASE_ROW;
use super::cluster::connect;
use crate::fence::epoch::Epoch;
use crate::lease::Elector;

/// The lease each worker takes: short, so the story fits in seconds (tick 1 s, give up after 2 s).
pub const LEASE: Duration = Duration::from_secs(3);

/// How long node-a is paused: past its lease by a tick, like a long GC pause.
const PAUSE: Duration = Duration::from_secs(4);

/// Where one run of the story sends its traffic.
pub struct Run {
    /// Printed in the timeline's heading.
    pub title: &'static str,
    /// The database.
    pub db: String,
    /// Port the workers' lease and write connections go to: pgfence's, or Postgres' own.
    pub port: u16,
    /// Whether writes pass through pgfence (for the wording only).
    pub fenced: bool,
}

/// What one UPDATE of `sweep_state` did.
#[derive(Debug, Clone)]
pub enum Write {
    /// It committed, changing this many rows.
    Committed(u64),
    /// The database refused it (through pgfence: the fence).
    Refused {
        /// SQLSTATE.
        code: String,
        /// The primary message.
        message: String,
        /// The HINT, if any.
        hint: Option<String>,
    },
}

/// What happened to node-a's write after its pause.
pub struct Outcome {
    /// node-a's last write.
    pub stale_write: Write,
    /// The note node-b wrote.
    pub b_note: String,
    /// The epoch node-b took over with.
    pub b_epoch: Epoch,
    /// The note node-a tried to write.
    pub a_note: String,
}

/// Prints timeline lines, `t=` seconds since the run started.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn say(&self, who: &str, what: impl Display) {
        crate::say!("  t={:>4.1}s  {who:<7} {what}", self.0.elapsed().as_secs_f64());
    }
}

/// Runs the story once and returns how node-a's stale write went.
pub async fn run(run: &Run) -> anyhow::Result<Outcome> {
    crate::say!("\n== {} ==", run.title);
    let clock = Clock(Instant::now());
    let (wrote_tx, wrote_rx) = watch::channel(None::<String>);
    let done = CancellationToken::new();
    let (a, b) = tokio::join!(
        node_a(run, clock, wrote_rx, done.clone()),
        node_b(run, clock, wrote_tx, done)
    );
    let (stale_write, a_note) = a?;
    let (b_note, b_epoch) = b?;
    Ok(Outcome {
        stale_write,
        b_note,
        b_epoch,
        a_note,
    })
}

fn elector(holder: &str) -> Elector {
    Elector::new(LEASE_ROW, holder).lease(LEASE)
}

/// The leader that gets paused. Acquires, writes, renews once, is paused past its lease, wakes
/// and writes again with the epoch it still believes in.
async fn node_a(
    run: &Run,
    clock: Clock,
    mut b_wrote: watch::Receiver<Option<String>>,
    done: CancellationToken,
) -> anyhow::Result<(Write, String)> {
    // Whatever happens, let node-b finish.
    let _done = done.drop_guard();
    let me = elector("node-a");
    let lease = connect(run.port, &run.db, "node-a-lease", None)
        .await
        .context("node-a: lease connection")?;
    let sent = Instant::now();
    let epoch = me
        .acquire(&lease)
        .await?
        .context("node-a: the lease should be free at the start")?;
    clock.say(
        "node-a",
        format!("acquired the lease: epoch {epoch} (valid for {LEASE:?} by the database's clock)"),
    );
    let data = declare(run, "node-a", epoch).await?;
    let via = if run.fenced {
        "to pgfence"
    } else {
        "straight to Postgres (which ignores the epoch)"
    };
    clock.say(
        "node-a",
        format!("connected {via} with options=-c pgfence.epoch={epoch}"),
    );
    let note = format!("swept by node-a at epoch {epoch}");
    report(clock, "node-a", epoch, &sweep(&data, &note, epoch).await?);

    sleep(me.tick().saturating_sub(sent.elapsed())).await;
    let renewed_at = Instant::now();
    anyhow::ensure!(
        me.renew(&lease, epoch).await?,
        "node-a: the first renewal should succeed"
    );
    clock.say(
        "node-a",
        format!("renewed the lease (still epoch {epoch}); it is the leader and starts its next sweep"),
    );

    clock.say(
        "node-a",
        format!("... PAUSED for {PAUSE:?}, like a stop-the-world GC pause: no renewals, no writes"),
    );
    sleep(PAUSE).await;
    // Keep the story in order on a slow machine: node-a wakes only after node-b has written.
    let _ = b_wrote.wait_for(Option::is_some).await;
    let path = if run.fenced {
        "through pgfence"
    } else {
        "straight to Postgres"
    };
    clock.say(
        "node-a",
        format!("wakes up; it never noticed the pause and finishes its sweep at epoch {epoch}, {path}"),
    );
    let stale_note = format!("swept by node-a at epoch {epoch}");
    let stale = sweep(&data, &stale_note, epoch).await?;
    report(clock, "node-a", epoch, &stale);

    let since = renewed_at.elapsed().as_secs_f64();
    if me.renew(&lease, epoch).await? {
        clock.say("node-a", "renewal succeeded (unexpected: nobody took over)");
    } else {
        clock.say(
            "node-a",
            format!(
                "renewal refused: the lease is no longer its own. Its clock says the last renewal was \
                 {since:.1}s ago (limit {:.1}s): it steps down",
                me.give_up_after().as_secs_f64()
            ),
        );
    }
    Ok((stale, stale_note))
}

/// The rival: stands by until the lease expires by the database's clock, takes over, writes,
/// and keeps renewing until the story ends.
async fn node_b(
    run: &Run,
    clock: Clock,
    wrote: watch::Sender<Option<String>>,
    done: CancellationToken,
) -> anyhow::Result<(String, Epoch)> {
    let me = elector("node-b");
    let lease = connect(run.port, &run.db, "node-b-lease", None)
        .await
        .context("node-b: lease connection")?;
    // Let node-a go first, as if it had simply started earlier.
    sleep(Duration::from_millis(200)).await;
    let mut announced = false;
    let epoch = loop {
        if let Some(epoch) = me.acquire(&lease).await? {
            break epoch;
        }
        if !announced && let Some(state) = me.inspect(&lease).await? {
            let holder = state.holder.as_deref().unwrap_or("nobody");
            let msg = format!(
                "lease held by {holder} (epoch {}, {:.1}s left by the database's clock); standing by, \
                 retrying every {:.1}s",
                state.epoch,
                state.expires_in,
                me.tick().as_secs_f64()
            );
            clock.say("node-b", msg);
            announced = true;
        }
        tokio::select! {
            () = done.cancelled() => anyhow::bail!("node-b never acquired the lease"),
            () = sleep(me.tick()) => {}
        }
    };
    clock.say(
        "node-b",
        format!("acquired the lease: epoch {epoch} (node-a's term expired by the database's clock)"),
    );
    let data = declare(run, "node-b", epoch).await?;
    let note = format!("swept by node-b at epoch {epoch}");
    report(clock, "node-b", epoch, &sweep(&data, &note, epoch).await?);
    wrote.send_replace(Some(note.clone()));
    keep_leading(&me, &lease, epoch, done).await?;
    clock.say(
        "node-b",
        format!("the story is over: released the lease (epoch {epoch} stays the latest)"),
    );
    Ok((note, epoch))
}

/// Renews every tick until `done`, then releases.
async fn keep_leading(me: &Elector, lease: &Client, epoch: Epoch, done: CancellationToken) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            () = done.cancelled() => break,
            () = sleep(me.tick()) => {}
        }
        anyhow::ensure!(me.renew(lease, epoch).await?, "node-b lost the lease");
    }
    me.release(lease, epoch).await?;
    Ok(())
}

/// A write connection declaring `epoch` at startup, the way a connection string does it.
async fn declare(run: &Run, who: &str, epoch: Epoch) -> anyhow::Result<Client> {
    connect(run.port, &run.db, who, Some(&format!("-c pgfence.epoch={epoch}")))
        .await
        .with_context(|| format!("{who}: write connection"))
}

/// The sweeper's write: one UPDATE of the shared row, stamped with the writer's epoch.
async fn sweep(client: &Client, note: &str, epoch: Epoch) -> anyhow::Result<Write> {
    let result = client
        .execute(
            "UPDATE sweep_state SET note = $1, last_epoch = $2 WHERE id = 1",
            &[&note, &epoch.as_i64()],
        )
        .await;
    match result {
        Ok(rows) => Ok(Write::Committed(rows)),
        Err(e) => match e.as_db_error() {
            Some(db) => Ok(Write::Refused {
                code: db.code().code().to_owned(),
                message: db.message().to_owned(),
                hint: db.hint().map(str::to_owned),
            }),
            None => Err(e).context("the write failed without an answer from the database"),
        },
    }
}

fn report(clock: Clock, who: &str, epoch: Epoch, write: &Write) {
    match write {
        Write::Committed(rows) => clock.say(
            who,
            format!("UPDATE sweep_state at epoch {epoch}: committed ({rows} row)"),
        ),
        Write::Refused { code, message, hint } => {
            clock.say(
                who,
                format!("UPDATE sweep_state at epoch {epoch}: REJECTED, SQLSTATE {code}"),
            );
            clock.say(who, format!("    ERROR:  {message}"));
            if let Some(hint) = hint {
                clock.say(who, format!("    HINT:   {hint}"));
            }
        }
    }
}
