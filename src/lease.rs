//! The lease of the seed design: leader election on a Postgres row, whose `epoch` is the
//! fencing token a leader declares to pgfence.
//!
//! A lease table has the contract's shape:
//!
//! ```sql
//! CREATE TABLE leader_lease (
//!   name text PRIMARY KEY, holder text, epoch bigint NOT NULL DEFAULT 0,
//!   expires_at timestamptz NOT NULL DEFAULT '-infinity');
//! ```
//!
//! Every operation is one statement, so it is atomic without an explicit transaction:
//!
//! - **acquire** is a compare-and-swap `UPDATE`: it succeeds when the row is vacant, expired,
//!   or already ours, and it always raises the epoch by one. Re-acquiring one's own lease is a
//!   new term with a new epoch, exactly as in the seed's SQL.
//! - **renew** extends `expires_at` and keeps the epoch; it names the epoch, so a holder that
//!   lost the lease and won it back under a new epoch cannot extend the old term.
//! - **release** empties the row (`holder = NULL`, `expires_at = '-infinity'`) at the same epoch,
//!   so a rival can acquire at once instead of waiting for expiry.
//!
//! # Clocks
//!
//! Expiry is judged only by the database's clock (`now()` in the statements): the lease never
//! compares timestamps from two machines. The leader judges its *own* term on its monotonic
//! clock instead: it steps down when no renewal has succeeded for [`Elector::give_up_after`]
//! (2/3 of the lease), counted from the moment it *sent* the last successful acquire or renew.
//! The database stamped that request's `expires_at` at a later instant, so the leader always
//! gives up at least 1/3 of a lease before a rival can take over. It renews every
//! [`Elector::tick`] (1/3 of the lease), so one failed renewal is survivable and two are not.
//! With the default 15 s lease: tick 5 s, give up after 10 s, failover within 15–20 s (the
//! lease plus up to one tick for the rival to notice).
//!
//! This margin is what keeps a *live* leader honest. A leader that is *paused* (GC, VM
//! migration, SIGSTOP) cannot look at any clock until it wakes, and may then write with a stale
//! epoch; that is what pgfence's fence is for.
//!
//! # Use
//!
//! [`Elector::acquire`], [`Elector::renew`] and [`Elector::release`] run one statement on a
//! client you pass in (a direct connection or one through pgfence: the lease table is not a
//! fenced table). [`Elector::lead`] waits until it wins the lease and returns a [`Leadership`]
//! whose [`token`](Leadership::token) fires when the leader steps down; a spawned task renews
//! the lease on its own connection meanwhile.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};
use tokio_postgres::{Client, Config, NoTls};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::fence::epoch::Epoch;
use crate::sql::name::TableName;

/// The lease duration the contract's timing rule starts from (tick 5 s, give up after 10 s).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// How long releasing the lease may take when a [`Leadership`] ends; past it the lease simply
/// expires on its own.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// A lease operation failed (the database said no, or could not be reached). Losing the lease
/// is not an error: `acquire` returns `None` and `renew` returns `false`.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The statement or the connection failed.
    #[error("lease: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The lease row holds an epoch that is not a valid fencing token (below 1).
    #[error("lease: row {row:?} granted epoch {epoch}, which is not a valid epoch (1 or more)")]
    InvalidEpoch {
        /// The lease row's `name`.
        row: String,
        /// What the row said.
        epoch: i64,
    },
}

/// The lease row as the database sees it now (see [`Elector::inspect`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseState {
    /// The holder, `None` when vacant (never acquired, or released).
    pub holder: Option<String>,
    /// The epoch of the latest acquisition (0: never acquired).
    pub epoch: i64,
    /// Seconds until the lease expires by the database's clock; negative once expired
    /// (`-inf` after a release).
    pub expires_in: f64,
}

impl LeaseState {
    /// Whether someone holds an unexpired lease.
    pub fn is_held(&self) -> bool {
        self.holder.is_some() && self.expires_in > 0.0
    }
}

/// One participant in an election on one lease row: which table and row, who we are, and how
/// long a term lasts. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Elector {
    table: String,
    name: String,
    holder: String,
    lease: Duration,
}

impl Elector {
    /// An elector for lease row `name` in `public.leader_lease`, acting as `holder` (a name
    /// unique to this process, e.g. host name and pid), with the default 15 s lease.
    pub fn new(name: impl Into<String>, holder: impl Into<String>) -> Self {
        Self {
            table: quote_table(&TableName::new(Some("public"), "leader_lease")),
            name: name.into(),
            holder: holder.into(),
            lease: DEFAULT_LEASE,
        }
    }

    /// Uses another lease table (of the seed's shape).
    pub fn table(mut self, table: &TableName) -> Self {
        self.table = quote_table(table);
        self
    }

    /// Sets the lease duration (the time a term lasts without renewal, by the database's clock).
    ///
    /// # Panics
    /// If `lease` is shorter than 3 ms (the tick would be zero).
    pub fn lease(mut self, lease: Duration) -> Self {
        assert!(lease >= Duration::from_millis(3), "a lease must last at least 3 ms");
        self.lease = lease;
        self
    }

    /// The lease row's `name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who we are in the `holder` column.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The lease duration.
    pub fn lease_duration(&self) -> Duration {
        self.lease
    }

    /// How often a leader renews: 1/3 of the lease.
    pub fn tick(&self) -> Duration {
        self.lease / 3
    }

    /// How long a leader goes on without a successful renewal before it steps down by its own
    /// clock: 2/3 of the lease.
    pub fn give_up_after(&self) -> Duration {
        self.lease * 2 / 3
    }

    /// `CREATE TABLE IF NOT EXISTS` for this elector's lease table, in the seed's shape.
    pub fn create_table_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, holder text, epoch bigint NOT NULL DEFAULT 0, \
             expires_at timestamptz NOT NULL DEFAULT '-infinity')",
            self.table
        )
    }

    /// Creates the lease row (vacant, epoch 0) unless it exists. Acquire never inserts: a
    /// missing row means no election has been set up, and silently starting one at epoch 1
    /// could hide a deleted row (pgfence's lease trigger starts a re-created row at a new
    /// epoch above the fence's high-water mark, so it is safe, just surprising).
    pub async fn ensure_row(&self, client: &Client) -> Result<(), LeaseError> {
        let sql = format!(
            "INSERT INTO {} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
            self.table
        );
        client.execute(&sql, &[&self.name]).await?;
        Ok(())
    }

    /// Tries to win the lease: succeeds when the row is vacant, expired (by the database's
    /// clock) or already ours, and returns the new epoch, one above the previous. `None` when
    /// someone else holds an unexpired lease, or the row does not exist.
    pub async fn acquire(&self, client: &Client) -> Result<Option<Epoch>, LeaseError> {
        let sql = format!(
            "UPDATE {} SET holder = $2, epoch = epoch + 1, expires_at = now() + $3::float8 * interval '1 second' \
             WHERE name = $1 AND (holder IS NULL OR holder = $2 OR expires_at < now()) RETURNING epoch::bigint",
            self.table
        );
        let row = client
            .query_opt(&sql, &[&self.name, &self.holder, &self.lease.as_secs_f64()])
            .await?;
        row.map(|row| self.epoch_of(row.try_get(0)?)).transpose()
    }

    /// Extends our term by a full lease, keeping `epoch`. `false` when the lease is no longer
    /// ours at that epoch (expired, taken over, released): the caller must stop leading.
    pub async fn renew(&self, client: &Client, epoch: Epoch) -> Result<bool, LeaseError> {
        let sql = format!(
            "UPDATE {} SET expires_at = now() + $4::float8 * interval '1 second' \
             WHERE name = $1 AND holder = $2 AND epoch = $3::bigint AND expires_at > now() RETURNING epoch",
            self.table
        );
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&self.name, &self.holder, &epoch.as_i64(), &self.lease.as_secs_f64()];
        Ok(client.query_opt(&sql, &params).await?.is_some())
    }

    /// Gives the lease up at once (same epoch, no holder, expired), so a rival need not wait
    /// for expiry. `false` when it was not ours at `epoch` any more (nothing changed).
    pub async fn release(&self, client: &Client, epoch: Epoch) -> Result<bool, LeaseError> {
        let sql = format!(
            "UPDATE {} SET holder = NULL, expires_at = '-infinity' WHERE name = $1 AND holder = $2 AND epoch = $3::bigint",
            self.table
        );
        Ok(client
            .execute(&sql, &[&self.name, &self.holder, &epoch.as_i64()])
            .await?
            == 1)
    }

    /// The lease row now, `None` when it does not exist.
    pub async fn inspect(&self, client: &Client) -> Result<Option<LeaseState>, LeaseError> {
        let sql = format!(
            "SELECT holder, epoch::bigint, extract(epoch FROM expires_at - now())::float8 FROM {} WHERE name = $1",
            self.table
        );
        let Some(row) = client.query_opt(&sql, &[&self.name]).await? else {
            return Ok(None);
        };
        Ok(Some(LeaseState {
            holder: row.try_get(0)?,
            epoch: row.try_get(1)?,
            expires_in: row.try_get(2)?,
        }))
    }

    /// Waits until this elector wins the lease (trying every [`tick`](Elector::tick)), then
    /// returns the [`Leadership`]; a spawned task renews it on its own connection to `config`
    /// until the leader steps down. Fails only when the database cannot be reached or a
    /// statement fails while waiting.
    ///
    /// Cancel safe: dropping the future before it returns leaves no task behind (a lease won in
    /// the very last statement simply expires).
    pub async fn lead(&self, config: &Config) -> Result<Leadership, LeaseError> {
        let client = connect(config).await?;
        loop {
            let sent = Instant::now();
            if let Some(epoch) = self.acquire(&client).await? {
                return Ok(self.spawn_renewals(config.clone(), client, epoch, sent));
            }
            sleep(self.tick()).await;
        }
    }

    /// One attempt at [`lead`](Elector::lead): `None` when someone else holds the lease.
    pub async fn try_lead(&self, config: &Config) -> Result<Option<Leadership>, LeaseError> {
        let client = connect(config).await?;
        let sent = Instant::now();
        Ok(self
            .acquire(&client)
            .await?
            .map(|epoch| self.spawn_renewals(config.clone(), client, epoch, sent)))
    }

    fn spawn_renewals(&self, config: Config, client: Client, epoch: Epoch, sent: Instant) -> Leadership {
        info!(lease = %self.name, holder = %self.holder, %epoch, "lease acquired");
        let token = CancellationToken::new();
        let stop = CancellationToken::new();
        let reason = Arc::new(OnceLock::new());
        let renewer = Renewer {
            elector: self.clone(),
            config,
            client: Some(client),
            epoch,
            deadline: sent + self.give_up_after(),
        };
        let task = tokio::spawn(renewer.run(token.clone(), stop.clone(), reason.clone()));
        Leadership {
            epoch,
            token,
            stop,
            reason,
            task: Some(task),
        }
    }

    fn epoch_of(&self, epoch: i64) -> Result<Epoch, LeaseError> {
        u64::try_from(epoch)
            .ok()
            .and_then(Epoch::new)
            .ok_or_else(|| LeaseError::InvalidEpoch {
                row: self.name.clone(),
                epoch,
            })
    }
}

/// Why a [`Leadership`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDown {
    /// No renewal succeeded for 2/3 of the lease (the database was unreachable or slow): the
    /// leader gave up by its own clock, before the lease can expire by the database's.
    Deadline,
    /// A renewal found the lease no longer ours at this epoch.
    Lost,
    /// [`Leadership::release`] was called, or the `Leadership` was dropped.
    Released,
}

/// A term as leader, from [`Elector::lead`]. Write only while [`token`](Leadership::token) has
/// not fired, and declare [`epoch`](Leadership::epoch) on every connection that writes, so that
/// pgfence refuses the writes that race the step-down (or follow a pause the leader never saw).
///
/// Dropping it stops the renewals and releases the lease.
#[derive(Debug)]
pub struct Leadership {
    /// The epoch this term was granted: the fencing token to declare (`pgfence.epoch`).
    pub epoch: Epoch,
    /// Fires when the leader steps down, whatever the reason.
    pub token: CancellationToken,
    stop: CancellationToken,
    reason: Arc<OnceLock<StepDown>>,
    task: Option<JoinHandle<()>>,
}

impl Leadership {
    /// Whether the leader has not stepped down yet.
    pub fn is_leading(&self) -> bool {
        !self.token.is_cancelled()
    }

    /// Why the leader stepped down; `None` while leading.
    pub fn step_down_reason(&self) -> Option<StepDown> {
        self.reason.get().copied()
    }

    /// Waits until the leader steps down and says why.
    ///
    /// Cancel safe.
    pub async fn stepped_down(&self) -> StepDown {
        self.token.cancelled().await;
        self.step_down_reason().unwrap_or(StepDown::Released)
    }

    /// Steps down now: stops renewing, fires the token, releases the lease (so a rival can
    /// take over at once) and returns once that is done.
    pub async fn release(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // The task never panics; a JoinError would mean the runtime is shutting down.
            let _ = task.await;
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The renewal loop of one term, on its own connection.
struct Renewer {
    elector: Elector,
    config: Config,
    client: Option<Client>,
    epoch: Epoch,
    /// When the leader steps down unless a renewal succeeds: the send time of the last
    /// successful acquire or renew plus 2/3 of the lease.
    deadline: Instant,
}

impl Renewer {
    async fn run(mut self, token: CancellationToken, stop: CancellationToken, reason: Arc<OnceLock<StepDown>>) {
        let (name, epoch) = (self.elector.name.clone(), self.epoch);
        let why = self.renew_until_step_down(&stop).await;
        // Record the reason before firing the token, so whoever wakes on it can read it.
        let _ = reason.set(why);
        token.cancel();
        match why {
            StepDown::Deadline => warn!(lease = %name, %epoch, "no renewal succeeded in time: stepping down"),
            StepDown::Lost => warn!(lease = %name, %epoch, "lease lost: stepping down"),
            StepDown::Released => {
                if let Some(client) = &self.client {
                    match timeout(RELEASE_TIMEOUT, self.elector.release(client, epoch)).await {
                        Ok(Ok(_)) => info!(lease = %name, %epoch, "lease released"),
                        Ok(Err(e)) => warn!(lease = %name, %epoch, error = %e, "release failed; the lease will expire"),
                        Err(_) => warn!(lease = %name, %epoch, "release timed out; the lease will expire"),
                    }
                }
            }
        }
    }

    /// Renews every tick until the lease is lost, the deadline passes or `stop` fires.
    async fn renew_until_step_down(&mut self, stop: &CancellationToken) -> StepDown {
        let tick = self.elector.tick();
        let mut next = Instant::now() + tick;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return StepDown::Released,
                () = sleep_until(self.deadline) => return StepDown::Deadline,
                () = sleep_until(next) => {}
            }
            let sent = Instant::now();
            next = sent + tick;
            let deadline = self.deadline;
            let attempt = tokio::select! {
                biased;
                () = stop.cancelled() => return StepDown::Released,
                r = timeout_at(deadline, self.renew_once()) => r,
            };
            match attempt {
                Err(_) => return StepDown::Deadline,
                Ok(Ok(true)) => {
                    debug!(lease = %self.elector.name, epoch = %self.epoch, "lease renewed");
                    self.deadline = sent + self.elector.give_up_after();
                }
                Ok(Ok(false)) => return StepDown::Lost,
                Ok(Err(e)) => {
                    // Try again next tick, on a new connection; the deadline decides when to give up.
                    warn!(lease = %self.elector.name, epoch = %self.epoch, error = %e, "lease renewal failed");
                    self.client = None;
                }
            }
        }
    }

    /// One renewal, reconnecting first if the last attempt failed.
    async fn renew_once(&mut self) -> Result<bool, LeaseError> {
        let client = match self.client.take() {
            Some(client) if !client.is_closed() => client,
            _ => connect(&self.config).await?,
        };
        let renewed = self.elector.renew(&client, self.epoch).await;
        self.client = Some(client);
        renewed
    }
}

/// Connects and drives the connection in a task of its own.
async fn connect(config: &Config) -> Result<Client, LeaseError> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(error = %e, "lease connection ended");
        }
    });
    Ok(client)
}

/// `"schema"."table"`, always quoted (the parts are already normalised).
fn quote_table(table: &TableName) -> String {
    let ident = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    match &table.schema {
        Some(schema) => format!("{}.{}", ident(schema), ident(&table.name)),
        None => ident(&table.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_follows_the_contract_rule() {
        let e = Elector::new("invoice-sweeper", "node-a");
        assert_eq!(e.lease_duration(), Duration::from_secs(15));
        assert_eq!(e.tick(), Duration::from_secs(5));
        assert_eq!(e.give_up_after(), Duration::from_secs(10));
        let e = e.lease(Duration::from_secs(3));
        assert_eq!(
            (e.tick(), e.give_up_after()),
            (Duration::from_secs(1), Duration::from_secs(2))
        );
    }

    #[test]
    fn table_names_are_always_quoted() {
        let e = Elector::new("x", "h").table(&TableName::new(Some("Ops"), "lease \"rows\""));
        assert!(
            e.create_table_sql()
                .contains("\"Ops\".\"lease \"\"rows\"\"\" (name text PRIMARY KEY")
        );
        assert!(
            Elector::new("x", "h")
                .create_table_sql()
                .contains("\"public\".\"leader_lease\"")
        );
    }

    #[test]
    fn only_positive_epochs_are_granted() {
        let e = Elector::new("x", "h");
        assert_eq!(e.epoch_of(7).ok(), Epoch::new(7));
        assert!(matches!(e.epoch_of(0), Err(LeaseError::InvalidEpoch { epoch: 0, .. })));
        assert!(e.epoch_of(-3).is_err());
    }
}
