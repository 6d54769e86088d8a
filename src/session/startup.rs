//! The startup phase of a session, up to the first ReadyForQuery.
//!
//! Authentication is relayed untouched: pgfence holds no credentials. The
//! upstream's BackendKeyData is kept for cancel requests and the client gets
//! the same pid with pgfence's own secret, so a client can only cancel its own
//! queries while `pg_backend_pid()` still matches what its driver reports.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, info};

use super::context::DbFences;
use super::declare::Declarations;
use super::state::Reported;
use crate::config::Mode;
use crate::error::ProxyError;
use crate::fence::epoch::Epoch;
use crate::fence::policy::Rejection;
use crate::protocol::codec;
use crate::protocol::frame::{self, Body, HEADER_LEN, peek_header};
use crate::protocol::startup::{
    FirstPacket, GSSENC_REQUEST, SSL_REQUEST, StartupError, StartupMessage, read_first_packet,
};
use crate::server::{CancelKeyGuard, ServerContext, UpstreamKey};
use crate::sql::lex::truncate_ident;

/// Postgres' `authentication_timeout` default.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest message body accepted during authentication: Postgres' own limit for the
/// client's answers (`PG_MAX_AUTH_TOKEN_LENGTH`, 65535 bytes with the length word), past
/// which it closes without a word.
const AUTH_MESSAGE_MAX: usize = 65535 - 4;

/// A session past startup, ready to relay.
pub struct Established {
    /// The client socket.
    pub client: TcpStream,
    /// The upstream socket, authenticated.
    pub upstream: TcpStream,
    /// Declarations from the startup packet.
    pub declared: Declarations,
    /// Fences of the session's database.
    pub fences: Arc<DbFences>,
    /// Unregisters the cancel key when the session ends.
    pub cancel_key: CancelKeyGuard,
    /// What the server reported at startup that decides how texts are read.
    pub reported: Reported,
}

/// Runs startup. `Ok(None)` when the connection was a cancel request, ended
/// with an error already reported to the client, or was cut short by shutdown:
/// a session still logging in holds no transaction, so a drain (or SIGINT) ends
/// it at once, with FATAL 57P01 once its startup packet has arrived.
pub async fn establish(mut client: TcpStream, ctx: &ServerContext) -> Result<Option<Established>, StartupError> {
    let started = AtomicBool::new(false);
    let outcome = tokio::select! {
        r = tokio::time::timeout(STARTUP_TIMEOUT, establish_inner(&mut client, ctx, &started)) => r,
        () = ctx.drain.cancelled() => {
            debug!("shutdown during startup");
            if started.load(Ordering::Relaxed) {
                let fatal = ProxyError::Shutdown.to_response();
                super::last_words(ctx, super::LAST_WORDS_SHUTDOWN, client.write_all(&fatal)).await;
            }
            return Ok(None);
        }
    };
    match outcome {
        Ok(Ok(Some((upstream, declared, fences, (key, reported))))) => Ok(Some(Established {
            client,
            upstream,
            declared,
            fences,
            cancel_key: key,
            reported,
        })),
        Ok(Ok(None)) => Ok(None),
        Ok(Err(e)) => {
            if let Some(err) = report(&e) {
                let fatal = match e {
                    // A client of protocol 2 or older reads only that protocol's errors. (Postgres
                    // takes version 0.0 for none given, and answers it in protocol 3.)
                    StartupError::UnsupportedProtocol(major, minor) if major < 3 && (major, minor) != (0, 0) => {
                        protocol_2_fatal(&err.to_string())
                    }
                    _ => err.to_response(),
                };
                super::last_words(ctx, super::LAST_WORDS, client.write_all(&fatal)).await;
            }
            Err(e)
        }
        Err(_) => {
            debug!("startup timed out");
            Ok(None)
        }
    }
}

/// Answers an encryption request `N`. Bytes already there were sent without waiting for the
/// answer: Postgres 15 refuses them after its answer (FATAL 08P01), and so does pgfence.
async fn refuse_encryption(client: &mut TcpStream, request: &'static str) -> Result<(), StartupError> {
    // The socket does not block: an empty buffer is WouldBlock.
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
    let early = socket2::SockRef::from(&*client).peek(&mut byte).is_ok_and(|n| n > 0);
    client.write_all(b"N").await?;
    if early {
        return Err(StartupError::UnencryptedAfter(request));
    }
    Ok(())
}

/// A repeated encryption request, refused as Postgres refuses it: as protocol `1234.5679`
/// (SSL) or `1234.5680` (GSS).
fn repeated(code: u32) -> StartupError {
    StartupError::UnsupportedProtocol(code >> 16, code & 0xffff)
}

/// A FATAL error in protocol 2's form, as Postgres answers a startup packet of that protocol
/// or older: `E`, then the text with its severity, a newline and a NUL (no length, no fields).
fn protocol_2_fatal(message: &str) -> BytesMut {
    let mut out = BytesMut::with_capacity(message.len() + 10);
    out.put_u8(b'E');
    out.put_slice(b"FATAL:  ");
    out.put_slice(message.as_bytes());
    out.put_slice(b"\n\0");
    out
}

/// Which startup errors get a FATAL before the close (Postgres closes silently on bad lengths).
fn report(e: &StartupError) -> Option<ProxyError> {
    match e {
        StartupError::Io(_) => None,
        StartupError::BadLength
        | StartupError::Malformed
        | StartupError::BadAuthLength
        | StartupError::UnencryptedAfter(_) => Some(ProxyError::Protocol(e.to_string())),
        StartupError::UnsupportedProtocol(..) => Some(ProxyError::Unsupported(e.to_string())),
        StartupError::Upstream(reason) => {
            info!(%reason, "upstream failed during startup");
            Some(ProxyError::UpstreamUnreachable(reason.clone()))
        }
    }
}

type Inner = Option<(TcpStream, Declarations, Arc<DbFences>, (CancelKeyGuard, Reported))>;

async fn establish_inner(
    client: &mut TcpStream,
    ctx: &ServerContext,
    started: &AtomicBool,
) -> Result<Inner, StartupError> {
    // As Postgres, which refuses both: an encryption request right after a refused one of
    // the same kind is read as a startup packet of its code's protocol version. (After a
    // refused one of the other kind, it is answered again.)
    let mut refused = None;
    let startup = loop {
        match read_first_packet(client).await? {
            FirstPacket::SslRequest if refused == Some(SSL_REQUEST) => return Err(repeated(SSL_REQUEST)),
            FirstPacket::GssEncRequest if refused == Some(GSSENC_REQUEST) => return Err(repeated(GSSENC_REQUEST)),
            FirstPacket::SslRequest => {
                refused = Some(SSL_REQUEST);
                refuse_encryption(client, "SSL request").await?
            }
            FirstPacket::GssEncRequest => {
                refused = Some(GSSENC_REQUEST);
                refuse_encryption(client, "GSSAPI encryption request").await?
            }
            FirstPacket::Cancel { pid, secret } => {
                ctx.cancel(pid, secret).await;
                return Ok(None);
            }
            FirstPacket::Startup(m) => break m,
        }
    };
    started.store(true, Ordering::Relaxed);
    let mut user = startup.get("user").unwrap_or_default().to_owned();
    // Postgres cuts both names to 63 bytes: a longer database name reaches that database.
    truncate_ident(&mut user);
    let mut database = startup
        .get("database")
        .filter(|d| !d.is_empty())
        .unwrap_or(&user)
        .to_owned();
    truncate_ident(&mut database);
    let span = tracing::Span::current();
    span.record("user", user.as_str());
    span.record("db", database.as_str());
    if startup.minor > 0 || !startup.protocol_options().is_empty() {
        let mut out = BytesMut::new();
        codec::negotiate_protocol_version(&mut out, 0, startup.protocol_options());
        client.write_all(&out).await?;
    }
    let fences = ctx.fences_for(&database);
    // An invalid epoch is refused where Postgres refuses an invalid setting: once the client
    // has logged in (authenticated, its role and database found and allowed), so that a
    // client Postgres turns away gets Postgres' own error and learns nothing of the fences.
    let (declared, refusal) = match startup_declarations(&startup, &fences) {
        Ok(d) => (d, None),
        Err(err) => (Declarations::default(), Some(err)),
    };
    if let Some(e) = declared.epoch.current() {
        span.record("epoch", e.to_string());
    }
    let mut upstream = match connect_upstream(ctx).await {
        Ok(s) => s,
        Err(err) => {
            info!(%err, "upstream unreachable");
            client.write_all(&err.to_response()).await?;
            return Ok(None);
        }
    };
    upstream
        .write_all(&startup.encode_for_upstream())
        .await
        .map_err(|e| StartupError::from(e).upstream())?;
    let Some(key) = relay_auth(client, &mut upstream, ctx, refusal.as_ref()).await? else {
        return Ok(None);
    };
    Ok(Some((upstream, declared, fences, key)))
}

/// `pgfence.epoch` / `pgfence.fence` from `options` (`-c`), then from raw
/// startup parameters, which Postgres applies last. An invalid epoch is refused naming
/// the fence it was for: the one `pgfence.fence` names, or the only one of `fences`.
fn startup_declarations(m: &StartupMessage, fences: &DbFences) -> Result<Declarations, Refusal> {
    let mut epoch = None;
    let mut invalid = None;
    let mut fence = None;
    let raw = m.params.iter().map(|(k, v)| (k.clone(), v.clone()));
    for (k, v) in m.option_settings().into_iter().chain(raw) {
        match k.to_ascii_lowercase().as_str() {
            "pgfence.epoch" => match Epoch::parse(&v) {
                Ok(e) => epoch = Some(e),
                Err(e) => {
                    invalid.get_or_insert(e.to_string());
                }
            },
            "pgfence.fence" => fence = Some(v),
            _ => {}
        }
    }
    if let Some(reason) = invalid {
        let named = match &fence {
            Some(name) => fences.names.iter().find(|n| *n == name),
            None => match fences.applicable.as_slice() {
                [only] => fences.names.get(usize::from(only.0)),
                _ => None,
            },
        };
        let setting = match named {
            Some(name) => format!("pgfence.epoch of fence \"{name}\""),
            None => "pgfence.epoch".to_owned(),
        };
        // Only a fence of this database that keeps an epoch there has a current one to give.
        let guarded = named.filter(|name| {
            fences.applicable.iter().any(|f| {
                let i = usize::from(f.0);
                fences.names.get(i) == Some(*name)
                    && (fences.config[i].mode == Mode::Reject || fences.lease_tables[i].is_some())
            })
        });
        return Err(Refusal {
            error: ProxyError::InvalidStartupEpoch(format!("{setting}: {reason}")),
            fence: guarded.cloned(),
        });
    }
    Ok(Declarations::from_startup(epoch, fence))
}

/// An invalid declaration in the startup packet, refused with FATAL PF003 once Postgres has
/// accepted the session.
#[derive(Debug)]
struct Refusal {
    /// The refusal as pgfence words it.
    error: ProxyError,
    /// The fence it was for, when the database keeps that fence's current epoch, which the
    /// refusal then names as every other refusal does.
    fence: Option<String>,
}

impl Refusal {
    /// The FATAL for the client: Postgres' own raising of it when it can add the fence's
    /// current epoch (the session is logged in by then, so Postgres can be asked), else
    /// pgfence's. `first` is the message of Postgres' that said it accepted the session.
    async fn answer(&self, upstream: &mut TcpStream, first: u8, limit: Duration) -> BytesMut {
        let asked = match &self.fence {
            Some(fence) => tokio::time::timeout(limit, self.raised_by_postgres(upstream, first, fence))
                .await
                .ok()
                .flatten(),
            None => None,
        };
        asked.unwrap_or_else(|| self.error.to_response())
    }

    /// Waits for Postgres' ReadyForQuery, then has it raise the refusal with the fence's
    /// current epoch appended (as a refused `SET` is raised) and returns that error as a
    /// FATAL. `None` if Postgres answers anything else.
    async fn raised_by_postgres(&self, upstream: &mut TcpStream, mut tag: u8, fence: &str) -> Option<BytesMut> {
        while tag != b'Z' {
            let (next, msg) = read_message(upstream).await.ok()?;
            if next == b'E' {
                debug!(error = ?String::from_utf8_lossy(&msg), "upstream error before ReadyForQuery");
                return None;
            }
            tag = next;
        }
        let (code, severity) = self.error.code();
        debug_assert_eq!(severity, crate::error::Severity::Fatal);
        let r = Rejection {
            code,
            message: self.error.to_string(),
            hint: self.error.hint().unwrap_or_default().to_owned(),
            fences: Vec::new(),
        };
        let mut query = BytesMut::new();
        codec::query(&mut query, &super::dispatch::raise_block(&r, &[fence]));
        upstream.write_all(&query).await.ok()?;
        let mut raised = None;
        loop {
            let (tag, msg) = read_message(upstream).await.ok()?;
            match tag {
                b'E' if frame::error_code(&msg[HEADER_LEN..]) == Some(code.as_bytes()) => {
                    raised = frame::error_as_fatal(&msg[HEADER_LEN..]);
                }
                b'Z' => return raised,
                _ => {}
            }
        }
    }
}

async fn connect_upstream(ctx: &ServerContext) -> Result<TcpStream, ProxyError> {
    let addr = ctx.config.upstream.as_str();
    match tokio::time::timeout(ctx.config.connect_timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            super::tune(&s);
            Ok(s)
        }
        Ok(Err(e)) => Err(crate::error::upstream_connect_error(&e)),
        Err(_) => Err(ProxyError::UpstreamUnreachable("timed out".into())),
    }
}

/// Relays authentication until ReadyForQuery. Returns the registered cancel
/// key and the settings the server reported, or `None` when the
/// upstream refused the session (its error was forwarded), or when `refusal` ended it.
/// `refusal` is sent in place of the first message that says Postgres accepted the
/// session (ParameterStatus, BackendKeyData or ReadyForQuery, after AuthenticationOk):
/// Postgres checks the role and the database after AuthenticationOk, and reports an
/// invalid setting only after those.
async fn relay_auth(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    ctx: &ServerContext,
    refusal: Option<&Refusal>,
) -> Result<Option<(CancelKeyGuard, Reported)>, StartupError> {
    let mut key = None;
    let mut reported = Reported::default();
    // A Postgres that accepts connections but does not answer (hung, or not Postgres) counts
    // as unreachable: its first answer must come within `connect_timeout`. Later answers may
    // take the time authentication takes (LDAP, RADIUS), bounded by the startup timeout.
    let limit = ctx.config.connect_timeout;
    let Ok(first) = tokio::time::timeout(limit, read_message(upstream)).await else {
        info!("upstream did not answer the startup packet");
        let err = ProxyError::UpstreamUnreachable(format!("no answer to the startup packet within {limit:?}"));
        client.write_all(&err.to_response()).await?;
        return Ok(None);
    };
    let mut next = Some(first);
    // What the upstream sends or fails to take is its fault, not the client's; but Postgres
    // closes without a word on an answer of the client's it cannot read, and so does pgfence.
    let malformed = || StartupError::Malformed.upstream();
    let mut answered = false;
    loop {
        let read = match next.take() {
            Some(m) => m,
            None => read_message(upstream).await,
        };
        let (tag, msg) = match read {
            Err(StartupError::Io(e)) if answered && e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(StartupError::Io(e));
            }
            other => other.map_err(StartupError::upstream)?,
        };
        answered = false;
        if let Some(refusal) = refusal
            && matches!(tag, b'S' | b'K' | b'Z')
        {
            info!(err = %refusal.error, "refused startup declaration");
            let answer = refusal.answer(upstream, tag, ctx.config.connect_timeout).await;
            client.write_all(&answer).await?;
            // Ended as a client ends it: Terminate, then what Postgres sent read up to its
            // close (a socket closed with unread bytes is reset, which Postgres logs).
            if upstream.write_all(b"X\0\0\0\x04").await.is_ok() {
                let mut rest = [0u8; 1024];
                let drain = async { while upstream.read(&mut rest).await.is_ok_and(|n| n > 0) {} };
                let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
            }
            return Ok(None);
        }
        match tag {
            b'R' => {
                let code = Body::new(&msg[HEADER_LEN..]).i32().ok_or_else(malformed)?;
                client.write_all(&msg).await?;
                // 0 = ok, 12 = SASL final: no answer expected. Every other request waits for the client.
                if !matches!(code, 0 | 12) {
                    let (_, answer) = read_message(client).await?;
                    upstream
                        .write_all(&answer)
                        .await
                        .map_err(|e| StartupError::from(e).upstream())?;
                    answered = true;
                }
            }
            b'K' => {
                let mut body = Body::new(&msg[HEADER_LEN..]);
                let pid = body.i32().ok_or_else(malformed)?;
                let secret = body.i32().ok_or_else(malformed)?;
                let guard = ctx.register_cancel(UpstreamKey { pid, secret });
                let mut out = BytesMut::new();
                codec::backend_key_data(&mut out, guard.pid(), guard.secret());
                client.write_all(&out).await?;
                key = Some(guard);
            }
            b'Z' => {
                client.write_all(&msg).await?;
                // Postgres always sends BackendKeyData for normal sessions; without it
                // cancel requests for this session simply find nothing.
                let key = key.unwrap_or_else(|| ctx.register_cancel(UpstreamKey { pid: 0, secret: 0 }));
                return Ok(Some((key, reported)));
            }
            b'E' => {
                client.write_all(&msg).await?;
                return Ok(None);
            }
            b'S' => {
                reported.note(&msg[HEADER_LEN..]);
                client.write_all(&msg).await?;
            }
            _ => client.write_all(&msg).await?,
        }
    }
}

/// Reads one whole message during startup.
async fn read_message(s: &mut TcpStream) -> Result<(u8, BytesMut), StartupError> {
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).await?;
    let h = peek_header(&head)
        .map_err(|_| StartupError::Malformed)?
        .ok_or(StartupError::Malformed)?;
    if h.body_len > AUTH_MESSAGE_MAX {
        return Err(StartupError::BadAuthLength);
    }
    let mut msg = BytesMut::with_capacity(h.total_len());
    msg.put_slice(&head);
    msg.resize(h.total_len(), 0);
    s.read_exact(&mut msg[HEADER_LEN..]).await?;
    Ok((h.tag, msg))
}
