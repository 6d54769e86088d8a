//! A writer connection and the fenced write transactions it sends, in every shape the contract
//! names: a read-modify-write in an explicit extended-protocol transaction, a multi-statement
//! simple Query (one implicit transaction), an explicit `BEGIN … COMMIT` in one simple Query,
//! pipelined extended-protocol batches, and a prepared statement executed over and over. Each
//! of those transactions also inserts its `events` row (see [`super::db`]). The rewrite-mode
//! table gets single-row updates on their own: a simple-Query UPDATE and an extended-protocol
//! upsert (`ON CONFLICT DO UPDATE`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{sleep, timeout};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage, Statement};
use tokio_util::sync::CancellationToken;

use super::db::{LEASE_ROW, ROWS, ROWS_FENCE};
use super::history::{Kind, Outcome, Record, Write};
use super::worker::Ctx;
use crate::common::pg::SUPERUSER;

/// Past this an attempt counts as unknown and its connection is dropped.
const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Pipelined transactions per batch.
const PIPELINE: usize = 3;

const PREPARED_INCR: &str = "WITH c AS (UPDATE counter SET v = v + 1 WHERE id = 1 RETURNING v) \
                             INSERT INTO events SELECT $1::bigint, $2::text, $3::bigint, 'incr' FROM c";
const PIPELINED_INSERT: &str = "WITH i AS (INSERT INTO items VALUES ($1::bigint, 0, $3::bigint)) \
                                INSERT INTO events VALUES ($1::bigint, $2::text, $3::bigint, 'insert')";

/// The rewrite-mode writes stamp the epoch themselves: through pgfence the rewrite replaces
/// that value with the session's epoch and adds `last_epoch <= N`; straight to Postgres (the
/// control) nothing stops a stale epoch from overwriting a newer one.
const ROW_UPSERT: &str = "INSERT INTO rw_rows (id, v, last_epoch, last_op) VALUES ($1, 1, $2, $3) \
                          ON CONFLICT (id) DO UPDATE SET v = rw_rows.v + 1, last_epoch = EXCLUDED.last_epoch, \
                          last_op = EXCLUDED.last_op";

/// The ways a writer sends a fenced write.
#[derive(Debug, Clone, Copy)]
enum Style {
    Rmw,
    Multi,
    InsertTx,
    Pipeline,
    Prepared,
    /// Rewrite mode: a simple-Query UPDATE of one row.
    RowUpdate,
    /// Rewrite mode: an extended-protocol upsert that always conflicts (an UPDATE of one row).
    RowUpsert,
}

impl Style {
    fn pick(rng: &mut StdRng, fence: Fence) -> Style {
        match fence {
            Fence::Reject => match rng.random_range(0..20) {
                0..6 => Style::Rmw,
                6..10 => Style::Multi,
                10..14 => Style::InsertTx,
                14..17 => Style::Pipeline,
                _ => Style::Prepared,
            },
            Fence::Rows => {
                if rng.random_bool(0.5) {
                    Style::RowUpdate
                } else {
                    Style::RowUpsert
                }
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Style::Rmw => "rmw",
            Style::Multi => "multi",
            Style::InsertTx => "insert_tx",
            Style::Pipeline => "pipeline",
            Style::Prepared => "prepared",
            Style::RowUpdate => "row_update",
            Style::RowUpsert => "row_upsert",
        }
    }
}

/// One planned transaction: its op id, what it changes, and (once sent) how it ended.
struct Attempt {
    op: i64,
    kind: Kind,
    rows: i64,
    result: Result<(), tokio_postgres::Error>,
}

/// Which fence a writer's connection writes to. A session holds an epoch for one fence
/// (`pgfence.fence`, declared at connection time), so a leader writes each fence on
/// connections of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// `counter`, `items`, `events`.
    Reject,
    /// `rw_rows`.
    Rows,
}

impl Fence {
    /// Writer `index` of a worker: even ones write the reject-mode fence, odd ones the
    /// rewrite-mode fence.
    pub fn of_writer(index: usize) -> Fence {
        if index % 2 == 0 { Fence::Reject } else { Fence::Rows }
    }

    fn name(self) -> &'static str {
        match self {
            Fence::Reject => LEASE_ROW,
            Fence::Rows => ROWS_FENCE,
        }
    }
}

/// A writer's connection, kept across terms (a new term declares its epoch with `SET`).
pub struct Conn {
    fence: Fence,
    client: Option<Client>,
    via: String,
    epoch: i64,
    prepared: Option<Statement>,
}

impl Conn {
    pub fn new(fence: Fence) -> Conn {
        Conn {
            fence,
            client: None,
            via: String::new(),
            epoch: 0,
            prepared: None,
        }
    }

    /// Writes until `term_over` fires, then hands the connection back for the next term.
    pub async fn write_term(mut self, ctx: Arc<Ctx>, epoch: i64, term_over: CancellationToken, seed: u64) -> Conn {
        let mut rng = StdRng::seed_from_u64(seed);
        while !term_over.is_cancelled() {
            if !self.ready(&ctx, epoch, &mut rng).await {
                sleep(Duration::from_millis(50)).await;
                continue;
            }
            let style = Style::pick(&mut rng, self.fence);
            let n = match style {
                Style::Pipeline => PIPELINE,
                _ => 1,
            };
            let ops: Vec<i64> = (0..n).map(|_| ctx.next_op()).collect();
            // The work a leader does between deciding to write and writing: the window a pause
            // turns into a stale write, as a GC pause does to a real leader.
            sleep(Duration::from_millis(rng.random_range(1..6))).await;
            let row = rng.random_range(1..=ROWS);
            let attempts = match timeout(OP_TIMEOUT, self.send(style, &ops, &ctx.config.name, epoch, row)).await {
                Ok(attempts) => attempts,
                Err(_) => {
                    self.client = None;
                    self.record_unknown(&ctx, style, &ops, epoch);
                    continue;
                }
            };
            let mut broken = false;
            for a in attempts {
                let (outcome, sqlstate) = outcome(&a.result);
                broken |= outcome == Outcome::Unknown;
                ctx.record(&Record::Write(Write {
                    worker: ctx.config.name.clone(),
                    epoch,
                    op: a.op,
                    kind: a.kind,
                    rows: a.rows,
                    style: style.name().into(),
                    via: self.via.clone(),
                    outcome,
                    sqlstate,
                }));
            }
            if broken {
                self.client = None;
            }
        }
        self
    }

    /// Connects (declaring the epoch at startup) or re-declares the epoch of a new term.
    async fn ready(&mut self, ctx: &Ctx, epoch: i64, rng: &mut StdRng) -> bool {
        if self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            if self.epoch == epoch {
                return true;
            }
            let set = format!("SET pgfence.epoch = {epoch}");
            let client = self.client.as_ref().expect("checked above");
            if timeout(OP_TIMEOUT, client.batch_execute(&set))
                .await
                .is_ok_and(|r| r.is_ok())
            {
                self.epoch = epoch;
                return true;
            }
        }
        self.client = None;
        self.prepared = None;
        let endpoint = &ctx.config.endpoints[rng.random_range(0..ctx.config.endpoints.len())];
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(endpoint.port)
            .user(SUPERUSER)
            .dbname(&ctx.config.db)
            .options(format!(
                "-c pgfence.epoch={epoch} -c pgfence.fence={}",
                self.fence.name()
            ))
            .connect_timeout(Duration::from_secs(2));
        let Ok(Ok((client, connection))) = timeout(OP_TIMEOUT, config.connect(NoTls)).await else {
            return false;
        };
        tokio::spawn(connection);
        self.client = Some(client);
        self.via = endpoint.name.clone();
        self.epoch = epoch;
        true
    }

    fn record_unknown(&self, ctx: &Ctx, style: Style, ops: &[i64], epoch: i64) {
        for &op in ops {
            let (kind, rows) = shape(style);
            ctx.record(&Record::Write(Write {
                worker: ctx.config.name.clone(),
                epoch,
                op,
                kind,
                rows,
                style: style.name().into(),
                via: self.via.clone(),
                outcome: Outcome::Unknown,
                sqlstate: None,
            }));
        }
    }

    /// Sends the transactions of one `style`; one attempt per op id. `row` is the row a
    /// rewrite-mode style writes.
    async fn send(&mut self, style: Style, ops: &[i64], worker: &str, epoch: i64, row: i32) -> Vec<Attempt> {
        let client = self.client.as_mut().expect("ready() connected");
        let (kind, rows) = shape(style);
        let attempt = |op, result| Attempt { op, kind, rows, result };
        match style {
            Style::Rmw => vec![attempt(ops[0], rmw(client, ops[0], worker, epoch).await)],
            Style::Multi => {
                let sql = format!(
                    "UPDATE counter SET v = v + 1 WHERE id = 1; INSERT INTO events VALUES ({}, '{worker}', {epoch}, 'incr')",
                    ops[0]
                );
                vec![attempt(ops[0], client.batch_execute(&sql).await)]
            }
            Style::InsertTx => {
                let op = ops[0];
                let sql = format!(
                    "BEGIN; INSERT INTO items VALUES ({op}, 0, {epoch}), ({op}, 1, {epoch}); \
                     INSERT INTO items VALUES ({op}, 2, {epoch}); \
                     INSERT INTO events VALUES ({op}, '{worker}', {epoch}, 'insert'); COMMIT"
                );
                let result = client.batch_execute(&sql).await;
                if result.is_err() {
                    // The error skipped the rest of the string, COMMIT included: leave the
                    // aborted transaction block before the next attempt.
                    let _ = client.batch_execute("ROLLBACK").await;
                }
                vec![attempt(op, result)]
            }
            Style::Pipeline => {
                // Issued together, tokio-postgres pipelines them: one Sync each, one write.
                type Params<'a> = [&'a (dyn ToSql + Sync); 3];
                let params: Vec<Params> = ops.iter().map(|op| -> Params { [op, &worker, &epoch] }).collect();
                let client = &*client;
                let results = join_all(params.iter().map(|p| client.execute(PIPELINED_INSERT, p))).await;
                ops.iter()
                    .zip(results)
                    .map(|(&op, r)| attempt(op, r.map(drop)))
                    .collect()
            }
            Style::Prepared => {
                let result = async {
                    if self.prepared.is_none() {
                        self.prepared = Some(client.prepare(PREPARED_INCR).await?);
                    }
                    let statement = self.prepared.as_ref().expect("prepared above");
                    client.execute(statement, &[&ops[0], &worker, &epoch]).await.map(drop)
                }
                .await;
                vec![attempt(ops[0], result)]
            }
            Style::RowUpdate => {
                let sql = format!(
                    "UPDATE rw_rows SET v = v + 1, last_epoch = {epoch}, last_op = {} WHERE id = {row}",
                    ops[0]
                );
                let result = client.simple_query(&sql).await.map(|messages| {
                    messages.iter().find_map(|m| match m {
                        SimpleQueryMessage::CommandComplete(n) => Some(*n),
                        _ => None,
                    })
                });
                vec![row_attempt(ops[0], result.map(|n| n.unwrap_or(0)))]
            }
            Style::RowUpsert => {
                let result = client.execute(ROW_UPSERT, &[&row, &epoch, &ops[0]]).await;
                vec![row_attempt(ops[0], result)]
            }
        }
    }
}

/// A rewrite-mode attempt: the rows it changed are what the client was told.
fn row_attempt(op: i64, result: Result<u64, tokio_postgres::Error>) -> Attempt {
    let rows = result.as_ref().map_or(0, |&n| n as i64);
    Attempt {
        op,
        kind: Kind::Row,
        rows,
        result: result.map(drop),
    }
}

/// What a style's transactions change.
fn shape(style: Style) -> (Kind, i64) {
    match style {
        Style::Rmw | Style::Multi | Style::Prepared => (Kind::Incr, 0),
        Style::InsertTx => (Kind::Insert, 3),
        Style::Pipeline => (Kind::Insert, 1),
        // The count the client will be told; for an unknown outcome nobody was told anything.
        Style::RowUpdate | Style::RowUpsert => (Kind::Row, 0),
    }
}

/// Read the counter under a row lock, write it back plus one, record the event, commit.
async fn rmw(client: &mut Client, op: i64, worker: &str, epoch: i64) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let v: i64 = tx
        .query_one("SELECT v FROM counter WHERE id = 1 FOR UPDATE", &[])
        .await?
        .get(0);
    tx.execute("UPDATE counter SET v = $1 WHERE id = 1", &[&(v + 1)])
        .await?;
    tx.execute(
        "INSERT INTO events VALUES ($1, $2, $3, 'incr')",
        &[&op, &worker, &epoch],
    )
    .await?;
    tx.commit().await
}

/// How the client saw an attempt end. An ERROR aborts the transaction, so nothing of it
/// committed; a FATAL or a broken connection may have come before or after the commit.
fn outcome(result: &Result<(), tokio_postgres::Error>) -> (Outcome, Option<String>) {
    match result {
        Ok(()) => (Outcome::Ok, None),
        Err(e) => match e.as_db_error() {
            Some(db) => {
                let code = Some(db.code().code().to_owned());
                if db.severity() == "ERROR" {
                    (Outcome::Rejected, code)
                } else {
                    (Outcome::Unknown, code)
                }
            }
            None => (Outcome::Unknown, None),
        },
    }
}
