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
mod dispatch;
mod relay;
mod rewriting;
mod startup;
pub mod state;

pub use context::DbFences;

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{Instrument, debug, info};

use crate::error::ProxyError;
use crate::server::ServerContext;
use dispatch::Dispatcher;
use relay::End;
use state::Shared;

/// Serves one client connection until it ends. Never panics on input; every
/// failure is reported to this client only.
pub async fn serve(client: TcpStream, peer: SocketAddr, id: u64, ctx: Arc<ServerContext>) {
    let span = tracing::info_span!("session", session = id, %peer, user = tracing::field::Empty,
        db = tracing::field::Empty, epoch = tracing::field::Empty);
    let established = async {
        let _ = client.set_nodelay(true);
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
        _cancel_key,
        reported,
    } = est;
    let mut disp = Dispatcher::new(fences, declared.clone());
    let mut state = Shared::new(declared);
    state.standard_conforming_strings = reported.standard_conforming_strings;
    state.encoding_hides_backslash = reported.encoding_hides_backslash;
    let shared = Mutex::new(state);
    let (mut cr, mut cw) = client.split();
    let (mut ur, mut uw) = upstream.split();
    let max = ctx.config.max_message_size;
    let end = {
        let mut c2u = pin!(relay::client_to_upstream(&mut cr, &mut uw, &shared, &mut disp, max));
        let mut u2c = pin!(relay::upstream_to_client(&mut ur, &mut cw, &shared));
        // Until the drain starts, only the drain token is watched (it is a child of the fast
        // token, so a fast shutdown cancels it too); after, the fast token and the grace period.
        let mut draining = false;
        let grace = tokio::time::sleep(ctx.config.shutdown_grace);
        let mut grace = pin!(grace);
        loop {
            tokio::select! {
                biased;
                end = &mut c2u => break end,
                end = &mut u2c => break end,
                () = ctx.drain.cancelled(), if !draining => {
                    if ctx.fast.is_cancelled() {
                        break End::Drained;
                    }
                    draining = true;
                    let mut st = shared.lock().unwrap_or_else(|p| p.into_inner());
                    st.draining = true;
                    if st.pending.is_empty() && st.tx_status == b'I' {
                        break End::Drained;
                    }
                    grace.as_mut().reset(tokio::time::Instant::now() + ctx.config.shutdown_grace);
                }
                () = ctx.fast.cancelled(), if draining => break End::Drained,
                () = &mut grace, if draining => break End::Drained,
            }
        }
    };
    finish(end, &mut client, &mut upstream).instrument(span).await;
}

/// Reports how the session ended, to the client where the protocol allows.
async fn finish(end: End, client: &mut TcpStream, upstream: &mut TcpStream) {
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
    if let Some(err) = fatal {
        let _ = client.write_all(&err.to_response()).await;
    }
    let _ = client.shutdown().await;
    // Closing the upstream socket ends its backend, which rolls back any open transaction.
    let mut terminate = BytesMut::new();
    if !matches!(end, End::ClientTerminated | End::UpstreamGone { .. }) {
        terminate.extend_from_slice(b"X\0\0\0\x04");
        let _ = upstream.write_all(&terminate).await;
    }
    let _ = upstream.shutdown().await;
    debug!(?end, "session closed");
}
