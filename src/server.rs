//! The accept loop, the connection limit, cancel-key mapping and shutdown.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::config::{Config, Fence};
use crate::error::ProxyError;
use crate::protocol::startup::{FirstPacket, read_first_packet};
use crate::session::{self, DbFences};

/// How long a forwarded cancel request waits for Postgres to close its connection.
const CANCEL_CLOSE_WAIT: Duration = Duration::from_secs(1);

/// How long a refused client (too many connections) may take to send its startup packet.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Ways to stop a running server.
#[derive(Clone, Default)]
pub struct Shutdown {
    /// SIGTERM: stop accepting, let transactions finish (up to the grace period), then 57P01.
    pub drain: CancellationToken,
    /// SIGINT: close everything now.
    pub fast: CancellationToken,
}

/// The upstream's cancel key for one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamKey {
    /// Upstream backend pid.
    pub pid: i32,
    /// Upstream secret.
    pub secret: i32,
}

struct CancelEntry {
    secret: i32,
    upstream: UpstreamKey,
}

/// Everything sessions share.
pub struct ServerContext {
    /// The configuration.
    pub config: Arc<Config>,
    /// Drain token: cancelled on SIGTERM once the listener is closed, so a client told
    /// 57P01 can no longer connect, and with the fast token.
    pub drain: CancellationToken,
    /// Fast-exit token (SIGINT).
    pub fast: CancellationToken,
    fences: Arc<[Fence]>,
    by_database: Mutex<HashMap<String, Arc<DbFences>>>,
    cancel_keys: Arc<Mutex<HashMap<i32, CancelEntry>>>,
}

/// Keeps a session's cancel key registered; unregisters it on drop.
pub struct CancelKeyGuard {
    pid: i32,
    secret: i32,
    upstream: UpstreamKey,
    keys: Arc<Mutex<HashMap<i32, CancelEntry>>>,
}

impl CancelKeyGuard {
    /// The pid pgfence gave the client.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The secret pgfence gave the client.
    pub fn secret(&self) -> i32 {
        self.secret
    }

    /// The upstream's key for this session's backend (pid 0: none was given).
    pub fn upstream(&self) -> UpstreamKey {
        self.upstream
    }
}

impl Drop for CancelKeyGuard {
    fn drop(&mut self) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        // The upstream may already have reused this pid for a newer session, which then took
        // the entry over: only remove our own.
        if keys.get(&self.pid).is_some_and(|e| e.secret == self.secret) {
            keys.remove(&self.pid);
        }
    }
}

/// Databases beyond this many get a fresh (uncached) fence view per session.
const MAX_CACHED_DATABASES: usize = 1024;

impl ServerContext {
    fn new(config: Arc<Config>, shutdown: &Shutdown) -> Self {
        let fences: Arc<[Fence]> = config.fences.clone().into();
        Self {
            config,
            // A child of the fast token: a fast shutdown is also a drain, so a session
            // watches one token until the drain starts.
            drain: shutdown.fast.child_token(),
            fast: shutdown.fast.clone(),
            fences,
            by_database: Mutex::new(HashMap::new()),
            cancel_keys: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The fence view for a database, shared by its sessions (and their analysis cache).
    pub fn fences_for(&self, database: &str) -> Arc<DbFences> {
        let mut map = self.by_database.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(database) {
            return f.clone();
        }
        let f = Arc::new(DbFences::for_database(self.fences.clone(), database));
        if map.len() < MAX_CACHED_DATABASES {
            map.insert(database.to_owned(), f.clone());
        }
        f
    }

    /// Registers a session's upstream key under the client-facing key: the upstream's own pid
    /// and a fresh secret.
    ///
    /// The pid is passed through because clients use it: drivers expose it (psycopg
    /// `info.backend_pid`, asyncpg `get_server_pid()`, node-pg `processID`) and applications
    /// compare it with `pg_backend_pid()`, `pg_stat_activity.pid` or the sender pid of a
    /// NotificationResponse to skip their own NOTIFYs. Only the secret is pgfence's, so the key
    /// a client holds is worthless against Postgres directly and the upstream secret never
    /// leaves pgfence. One proxy has one upstream, so live pids are unique; a pid the upstream
    /// reused while an ended session is still being torn down is taken over by the new session.
    pub fn register_cancel(&self, upstream: UpstreamKey) -> CancelKeyGuard {
        let mut keys = self.cancel_keys.lock().unwrap_or_else(|p| p.into_inner());
        let mut pid = upstream.pid;
        // No usable upstream pid (no BackendKeyData): invent one no live session uses.
        while pid <= 0 || (pid != upstream.pid && keys.contains_key(&pid)) {
            pid = rand::random::<i32>() & 0x3fff_ffff;
        }
        let secret = rand::random::<i32>();
        keys.insert(pid, CancelEntry { secret, upstream });
        CancelKeyGuard {
            pid,
            secret,
            upstream,
            keys: self.cancel_keys.clone(),
        }
    }

    /// Forwards a cancel request to the upstream when the key matches.
    /// Like Postgres, it never tells the requester whether anything happened.
    pub async fn cancel(&self, pid: i32, secret: i32) {
        let target = {
            let keys = self.cancel_keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.get(&pid)
                .filter(|e| constant_time_eq(e.secret, secret))
                .map(|e| e.upstream)
        };
        let Some(upstream) = target else {
            info!(pid, "cancel request with an unknown key ignored");
            return;
        };
        self.cancel_upstream(upstream).await;
    }

    /// Sends the upstream a cancel request for the backend with this key, as Postgres'
    /// own clients do: on a new connection, with no answer.
    pub async fn cancel_upstream(&self, upstream: UpstreamKey) {
        if upstream.pid == 0 {
            return;
        }
        let mut msg = BytesMut::with_capacity(16);
        msg.put_u32(16);
        msg.put_u32(80_877_102);
        msg.put_i32(upstream.pid);
        msg.put_i32(upstream.secret);
        let sent = async {
            let mut s = TcpStream::connect(self.config.upstream.as_str()).await?;
            s.write_all(&msg).await?;
            Ok::<_, std::io::Error>(s)
        };
        let mut s = match tokio::time::timeout(self.config.connect_timeout, sent).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return warn!(error = %e, "cancel could not be forwarded"),
            Err(_) => return warn!("cancel forwarding timed out"),
        };
        // Postgres closes once it has signalled the backend: wait for that (a while at
        // most), so what the caller does next (a session closing its upstream) comes after
        // the cancel.
        let mut rest = [0u8; 64];
        let closed = async { while matches!(s.read(&mut rest).await, Ok(n) if n > 0) {} };
        let _ = tokio::time::timeout(CANCEL_CLOSE_WAIT, closed).await;
        debug!(pid = upstream.pid, "cancel sent upstream");
    }
}

/// Compares secrets without an early exit on the first differing byte, so
/// response timing tells an attacker nothing about a guessed key.
fn constant_time_eq(a: i32, b: i32) -> bool {
    let diff = a
        .to_be_bytes()
        .iter()
        .zip(b.to_be_bytes())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Descriptors a running server needs besides its sessions: the listener, the log, the
/// runtime's own, cancel requests and refusals in flight.
const SPARE_FDS: u64 = 64;

/// The open-file limit after [`fit_open_files`], for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit found at start.
    pub was: u64,
    /// The soft limit now.
    pub now: u64,
    /// The hard limit, which only root can raise.
    pub hard: u64,
    /// What `max_client_conn` sessions need: two descriptors each (client and upstream) and
    /// [`SPARE_FDS`].
    pub needed: u64,
}

impl OpenFiles {
    /// How many sessions fit in the limit now.
    pub fn sessions(&self) -> u64 {
        self.now.saturating_sub(SPARE_FDS) / 2
    }
}

/// Raises the soft open-file limit, up to the hard one, so that `max_client_conn` sessions
/// fit (a common default of 1024 holds about 480). Past the limit `accept` fails and a
/// client waits unanswered rather than get `53300`, so the caller warns when they still do
/// not fit. `None` where the soft limit is already unlimited.
pub fn fit_open_files(max_client_conn: usize) -> Option<OpenFiles> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let was = limit.current?;
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let needed = (max_client_conn as u64).saturating_mul(2).saturating_add(SPARE_FDS);
    let mut now = was;
    if was < needed {
        let want = needed.min(hard);
        let mut raised = limit;
        raised.current = Some(want);
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => now = want,
            Err(e) => warn!(error = %e, from = was, to = want, "could not raise the open-file limit"),
        }
    }
    Some(OpenFiles { was, now, hard, needed })
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    config: Arc<Config>,
}

impl Server {
    /// Binds the listen address.
    pub async fn bind(config: Arc<Config>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(config.listen.as_str()).await?;
        Ok(Self { listener, config })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until shutdown. On drain, stops accepting at once and returns
    /// when every session has ended.
    pub async fn run(self, shutdown: Shutdown) {
        let ctx = Arc::new(ServerContext::new(self.config.clone(), &shutdown));
        let limit = Arc::new(Semaphore::new(self.config.max_client_conn));
        let tracker = TaskTracker::new();
        let mut next_id: u64 = 0;
        let mut accept_errors: Option<Instant> = None;
        info!(listen = %self.config.listen, upstream = %self.config.upstream, fences = self.config.fences.len(), "pgfence serving");
        loop {
            let accepted = tokio::select! {
                // Shutdown first: no connection is accepted once it began.
                biased;
                () = shutdown.drain.cancelled() => break,
                () = shutdown.fast.cancelled() => break,
                r = self.listener.accept() => r,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning, and say so once a
                    // second, not at every try.
                    if accept_errors.is_none_or(|at: Instant| at.elapsed() >= Duration::from_secs(1)) {
                        if crate::error::out_of_files(&e) {
                            error!(error = %e, "accept failed: a client waits unanswered (see the open-file limit at start)");
                        } else {
                            error!(error = %e, "accept failed");
                        }
                        accept_errors = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            next_id += 1;
            let id = next_id;
            match limit.clone().try_acquire_owned() {
                Ok(permit) => {
                    let ctx = ctx.clone();
                    tracker.spawn(async move {
                        session::serve(stream, peer, id, ctx).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    warn!(%peer, "connection limit reached");
                    tracker.spawn(refuse(stream, ctx.clone()));
                }
            }
        }
        drop(self.listener);
        // Only now tell the sessions: the listener is gone before any client hears 57P01.
        ctx.drain.cancel();
        info!(
            sessions = tracker.len(),
            last_session = next_id,
            "listener closed; waiting for sessions"
        );
        tracker.close();
        tracker.wait().await;
        info!("pgfence stopped");
    }
}

/// Answers a connection over the limit with FATAL 53300, after its startup
/// packet as Postgres does (so the client reads a proper error).
/// Cancel requests are still served: they hold no session.
async fn refuse(mut stream: TcpStream, ctx: Arc<ServerContext>) {
    let answer = async {
        loop {
            match read_first_packet(&mut stream).await {
                Ok(FirstPacket::SslRequest | FirstPacket::GssEncRequest) => stream.write_all(b"N").await?,
                Ok(FirstPacket::Startup(_)) => break,
                Ok(FirstPacket::Cancel { pid, secret }) => {
                    ctx.cancel(pid, secret).await;
                    return Ok(());
                }
                Err(_) => return Ok(()),
            }
        }
        stream.write_all(&ProxyError::TooManyConnections.to_response()).await
    };
    tokio::select! {
        _ = tokio::time::timeout(REFUSAL_TIMEOUT, answer) => {}
        () = ctx.drain.cancelled() => {}
    }
}
