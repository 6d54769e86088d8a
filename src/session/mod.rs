//! One client connection: startup, authentication relay, then the relay loop.
//!
//! ```text
//! accept ──▶ startup packet ──▶ (SSLRequest/GSSENCRequest → 'N') ──▶ CancelRequest → forward, close
//!                 │
//!                 ▼
//!   declarations from the startup packet (invalid → FATAL PF003)
//!                 │
//!                 ▼
//!   connect upstream, send StartupMessage ──▶ relay auth both ways ──▶ BackendKeyData: same pid,
//!                 │                                                          pgfence's own secret
//!                 ▼
//!   ReadyForQuery ──▶ relay: client_to_upstream ‖ upstream_to_client (one select!)
//! ```

mod context;
pub mod declaration;
pub mod declare;
pub mod dispatch;
mod names;
mod positions;
mod relay;
mod rewriting;
mod startup;
pub mod state;

pub use context::DbFences;

use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{Instrument, debug, info};

use crate::error::ProxyError;
use crate::server::{ServerContext, UpstreamKey};
use dispatch::Dispatcher;
use relay::End;
use state::Shared;

/// Socket options of both legs of a session: no Nagle delay (every message is flushed
/// whole), and TCP keepalive with the system's timing, as Postgres and PgBouncer set it, so
/// a peer whose host vanished is noticed and its session (with any transaction and fence
/// lock it holds upstream) ends.
pub(crate) fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = socket2::SockRef::from(stream).set_keepalive(true);
}

/// Serves one client connection until it ends. Never panics on input; every
/// failure is reported to this client only.
pub async fn serve(client: TcpStream, peer: SocketAddr, id: u64, ctx: Arc<ServerContext>) {
    let span = tracing::info_span!("session", session = id, %peer, user = tracing::field::Empty,
        db = tracing::field::Empty, epoch = tracing::field::Empty);
    let established = async {
        tune(&client);
        startup::establish(client, &ctx).await
    }
    .instrument(span.clone())
    .await;
    match established {
        Ok(Some(est)) => relay_session(est, &ctx, span).await,
        Ok(None) => {}
        Err(e) => span.in_scope(|| debug!(error = %e, "session ended during startup")),
    }
}

/// The relay loop runs outside the session's span: entering a span on every
/// poll costs a few percent of a proxied query, and nothing in the loop logs.
/// Startup and [`finish`], which do log, run inside it.
async fn relay_session(est: startup::Established, ctx: &ServerContext, span: tracing::Span) {
    let startup::Established {
        mut client,
        mut upstream,
        declared,
        fences,
        cancel_key,
        reported,
    } = est;
    let mut state = Shared::new(declared.clone());
    state.reported = reported;
    state.fences = Some(fences.clone());
    let mut disp = Dispatcher::new(fences, declared);
    let shared = Mutex::new(state);
    let (mut cr, mut cw) = client.split();
    let (mut ur, mut uw) = upstream.split();
    let max = ctx.config.max_message_size;
    let mid_message = AtomicBool::new(false);
    let room = tokio::sync::Notify::new();
    // The upstream's last message was an error.
    let mut said = false;
    let end = {
        let mut c2u = pin!(relay::client_to_upstream(
            &mut cr, &mut uw, &shared, &room, &mut disp, max
        ));
        let mut u2c = pin!(relay::upstream_to_client(
            &mut ur,
            &mut cw,
            &shared,
            &room,
            &mid_message
        ));
        // Until the drain starts, only the drain token is watched (it is a child of the fast
        // token, so a fast shutdown cancels it too); after, the fast token and the grace period.
        let mut draining = false;
        let grace = tokio::time::sleep(ctx.config.shutdown_grace);
        let mut grace = pin!(grace);
        let mut drain = OnWake::new(ctx.drain.cancelled());
        // How the client's side ended, while the replies Postgres still owes it are relayed.
        let mut client_end = None;
        loop {
            // Not biased: both directions run in this one task, and once a direction used
            // up tokio's per-poll budget (a client flooding messages), the other's reads in
            // the same poll fail too. A fixed order would then starve the upstream's
            // replies for as long as the client sends; tokio picks the first branch anew
            // on every poll.
            tokio::select! {
                end = &mut c2u, if client_end.is_none() => match end {
                    End::ClientTerminated | End::ClientGone | End::ClientProtocol(_) => client_end = Some(end),
                    end => break end,
                },
                end = &mut u2c => {
                    // Postgres' last word was an error (it ended the COPY the client broke off):
                    // pgfence's FATAL would be a second one.
                    said = matches!(end, End::UpstreamGone { after_error: true });
                    break client_end.unwrap_or(end);
                }
                () = &mut drain, if !draining => {
                    if ctx.fast.is_cancelled() {
                        break client_end.unwrap_or(End::Drained);
                    }
                    draining = true;
                    let mut st = shared.lock().unwrap_or_else(|p| p.into_inner());
                    st.draining = true;
                    if st.drainable() {
                        break client_end.unwrap_or(End::Drained);
                    }
                    grace.as_mut().reset(tokio::time::Instant::now() + ctx.config.shutdown_grace);
                }
                () = ctx.fast.cancelled(), if draining => break End::Drained,
                () = &mut grace, if draining => break End::Drained,
            }
        }
    };
    let limit = if matches!(end, End::Drained) {
        LAST_WORDS_SHUTDOWN
    } else {
        LAST_WORDS
    };
    // A shutdown that cuts a session short while Postgres still works for it stops that
    // work first, as Postgres' own shutdown does: closing the socket alone would let the
    // statement run on, and commit, after the client was told the session is over.
    let busy = matches!(end, End::Drained) && !shared.lock().unwrap_or_else(|p| p.into_inner()).pending.is_empty();
    let cancel = busy.then(|| (ctx, cancel_key.upstream()));
    let quiet = mid_message.into_inner() || (said && matches!(end, End::ClientProtocol(_)));
    let ending = finish(end, quiet, &mut client, upstream, cancel);
    last_words(ctx, limit, ending.instrument(span)).await;
}

/// How long the end of a session may take to write its FATAL and close both sockets.
const LAST_WORDS: Duration = Duration::from_secs(5);
/// The same when shutdown ends the session (the grace period, if any, is already over).
const LAST_WORDS_SHUTDOWN: Duration = Duration::from_secs(1);
/// The same after SIGINT, which closes everything within a second.
const LAST_WORDS_FAST: Duration = Duration::from_millis(200);

/// Runs what a session says and does as it ends (`words`) for at most `limit`, or
/// [`LAST_WORDS_FAST`] once SIGINT came: a client that stopped reading must not hold the
/// session, or a stopping proxy, open.
async fn last_words(ctx: &ServerContext, limit: Duration, words: impl Future) {
    tokio::select! {
        _ = tokio::time::timeout(limit, words) => {}
        () = async {
            ctx.fast.cancelled().await;
            tokio::time::sleep(LAST_WORDS_FAST).await;
        } => {}
    }
}

/// A future polled only after it woke its task itself, not on every wake of the task:
/// the drain signal, beside two relay directions that wake the session for every
/// message, would otherwise be polled (a lock and a waker check) on each.
struct OnWake<F> {
    future: Pin<Box<F>>,
    flag: Arc<WakeFlag>,
    waker: Waker,
    /// The task waker `flag` passes wakes on to.
    task: Option<Waker>,
}

/// Marks that the wrapped future asked to be polled, then wakes the task.
#[derive(Default)]
struct WakeFlag {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Set before waking, so the poll the wake causes sees it.
        self.woken.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            task.wake_by_ref();
        }
    }
}

impl<F: Future> OnWake<F> {
    fn new(future: F) -> Self {
        let flag = Arc::new(WakeFlag::default());
        Self {
            future: Box::pin(future),
            waker: Waker::from(Arc::clone(&flag)),
            flag,
            task: None,
        }
    }
}

impl<F: Future> Future for OnWake<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let woken = this.flag.woken.swap(false, Ordering::AcqRel);
        let same_task = this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker()));
        if !same_task {
            // First poll, or polled from another task: wakes go there now, and the
            // future has to be looked at since nothing may be registered for it yet.
            *this.flag.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
            this.task = Some(cx.waker().clone());
        } else if !woken {
            return Poll::Pending;
        }
        this.future.as_mut().poll(&mut Context::from_waker(&this.waker))
    }
}

/// Reports how the session ended, to the client where the protocol allows: not after
/// part of a message (`quiet`), which the client would read the report into. Postgres,
/// too, only closes the connection then. (`quiet` also when Postgres' own error ended a
/// session the client broke.)
///
/// `cancel`: Postgres still works for the session; the upstream connection is reset and
/// its backend gets a cancel request while the client is told.
async fn finish(
    end: End,
    quiet: bool,
    client: &mut TcpStream,
    mut upstream: TcpStream,
    cancel: Option<(&ServerContext, UpstreamKey)>,
) {
    let fatal = match &end {
        End::ClientGone | End::ClientTerminated => None,
        End::ClientProtocol(reason) => {
            info!(%reason, "closing session: protocol violation");
            Some(ProxyError::Protocol(reason.clone()))
        }
        End::UpstreamGone { after_error: true } => None,
        End::UpstreamGone { after_error: false } | End::UpstreamProtocol => {
            info!("upstream connection lost");
            Some(ProxyError::UpstreamLost)
        }
        End::Drained => Some(ProxyError::Shutdown),
        End::Io(e) => {
            debug!(error = %e, "session I/O error");
            None
        }
    };
    // Side by side: a client that stopped reading must not hold up the cancel.
    let tell = async {
        if let Some(err) = fatal.filter(|_| !quiet) {
            let _ = client.write_all(&err.to_response()).await;
        }
        let _ = client.shutdown().await;
    };
    if let Some((ctx, key)) = cancel {
        // Postgres' own shutdown ends the backend; pgfence cannot, and the cancel stops only
        // the statement running. What the client sent after it is in the backend's input
        // already and would run, and commit, while the client is told 57P01. So the
        // connection is reset first: the cancelled statement's reply then finds the client
        // gone, and the backend ends at its next interrupt check, before it commits more.
        let _ = socket2::SockRef::from(&upstream).set_linger(Some(Duration::ZERO));
        drop(upstream);
        tokio::join!(tell, ctx.cancel_upstream(key));
        debug!(?end, "session closed");
        return;
    }
    tell.await;
    // Closing the upstream socket ends its backend, which rolls back any open transaction.
    let mut terminate = BytesMut::new();
    if !matches!(end, End::ClientTerminated | End::UpstreamGone { .. }) {
        terminate.extend_from_slice(b"X\0\0\0\x04");
        let _ = upstream.write_all(&terminate).await;
    }
    let _ = upstream.shutdown().await;
    debug!(?end, "session closed");
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts the wakes of a task.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Counts its polls, keeps the last waker, and is ready once `done` is set.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        waker: Mutex<Option<Waker>>,
        done: AtomicBool,
    }

    fn probe_future(p: Arc<Probe>) -> impl Future<Output = ()> {
        std::future::poll_fn(move |cx| {
            p.polls.fetch_add(1, Ordering::SeqCst);
            *p.waker.lock().unwrap() = Some(cx.waker().clone());
            if p.done.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    #[test]
    fn on_wake_polls_the_future_only_after_its_own_wake() {
        let probe = Arc::new(Probe::default());
        let mut fut = pin!(OnWake::new(probe_future(Arc::clone(&probe))));
        let task = Arc::new(Task::default());
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        let polls = || probe.polls.load(Ordering::SeqCst);
        let wake_inner = || probe.waker.lock().unwrap().as_ref().unwrap().wake_by_ref();

        // The first poll registers the future.
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls(), 1);
        // Wakes of the task from elsewhere do not poll it.
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls(), 1);
        // Its own wake reaches the task and gets it polled, once.
        wake_inner();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls(), 2);

        // Polled from another task: looked at at once, and later wakes go there.
        let other = Arc::new(Task::default());
        let other_waker = Waker::from(Arc::clone(&other));
        let mut other_cx = Context::from_waker(&other_waker);
        assert!(fut.as_mut().poll(&mut other_cx).is_pending());
        assert_eq!(polls(), 3);
        probe.done.store(true, Ordering::SeqCst);
        wake_inner();
        assert_eq!(other.0.load(Ordering::SeqCst), 1);
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert!(fut.as_mut().poll(&mut other_cx).is_ready());
        assert_eq!(polls(), 4);
    }
}
