//! The two relay directions of a session. Each is one long-running future;
//! the session polls both in one `select!`, so neither direction can block
//! the other (a proxy that wrote and read in turn could deadlock against a
//! pipelining client).
//!
//! Bytes are forwarded in the chunks they arrive in. Only the messages pgfence
//! inspects are read whole, and only those it changes are rebuilt; everything
//! else streams through whatever its size.

use std::borrow::Cow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use super::dispatch::{ANALYSE_APART, Dispatcher};
use super::names;
use super::state::{MAX_COPY_ENDS, MAX_PENDING, Shared, Verdict};
use crate::protocol::frame::{Body, HEADER_LEN, peek_header};
use crate::sql::lex::MAX_IDENT_BYTES;

/// Read buffer size; also what an idle session keeps per direction.
const READ_CHUNK: usize = 8 * 1024;
/// Bind messages are inspected through their first bytes only (the names).
const BIND_PREFIX: usize = 64 * 1024;
/// Largest small client message (Execute, Close, Describe, Sync, Flush, Terminate):
/// Postgres' own limit is 10 000 bytes (`PQ_SMALL_MESSAGE_LIMIT`).
const SMALL_MESSAGE: usize = 64 * 1024;
/// Server messages read whole (ReadyForQuery, CommandComplete, ErrorResponse, ParameterStatus,
/// ParameterDescription) up to this size.
const SERVER_INSPECT: usize = 1024 * 1024;
/// Postgres' largest acceptable message length, length word included (`PQ_LARGE_MESSAGE_LIMIT`):
/// it ends a session that sends more, even as streamed COPY data. Also the bound of the
/// Queries pgfence builds, whose length word could not hold more.
const PG_MESSAGE_LIMIT: usize = 0x3fff_fffe;
/// Buffers grown past this are released once empty.
const SHRINK_ABOVE: usize = 1024 * 1024;
/// Runs `f`, which may take long (handling a message of many megabytes, see
/// [`ANALYSE_APART`]), after handing this worker thread's other sessions to another thread, so
/// that none of them waits for it. Only a multi-threaded runtime can; on one thread `f`
/// just runs.
fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Why a relay direction stopped.
#[derive(Debug)]
pub enum End {
    /// The client closed its socket.
    ClientGone,
    /// The client sent Terminate.
    ClientTerminated,
    /// The client broke the protocol.
    ClientProtocol(String),
    /// The upstream closed; `after_error` when its last message was an ErrorResponse.
    UpstreamGone {
        /// The upstream said why (a FATAL) before closing.
        after_error: bool,
    },
    /// The upstream sent bytes that are not protocol messages.
    UpstreamProtocol,
    /// Shutdown is draining and the session has no open transaction.
    Drained,
    /// I/O error on either side.
    Io(std::io::Error),
}

/// Collects what to write: while every message is forwarded as it came, the
/// input is written directly; the first change switches to copying.
struct Emitter {
    out: BytesMut,
    copying: bool,
}

impl Emitter {
    fn new() -> Self {
        Self {
            out: BytesMut::new(),
            copying: false,
        }
    }

    fn start_copying(&mut self, buf: &[u8], pos: usize) {
        if !self.copying {
            self.out.extend_from_slice(&buf[..pos]);
            self.copying = true;
        }
    }

    /// `buf[pos..end]` goes out unchanged.
    fn forward(&mut self, buf: &[u8], pos: usize, end: usize) {
        if self.copying {
            self.out.extend_from_slice(&buf[pos..end]);
        }
    }

    /// Something else goes out in place of (or before) `buf[pos..]`.
    fn insert(&mut self, buf: &[u8], pos: usize, bytes: &[u8]) {
        self.start_copying(buf, pos);
        self.out.extend_from_slice(bytes);
    }

    /// `buf[pos..]`'s next bytes are dropped.
    fn skip(&mut self, buf: &[u8], pos: usize) {
        self.start_copying(buf, pos);
    }

    /// Writes the round's output: `buf[..pos]` directly, or the copy.
    async fn flush<W: AsyncWrite + Unpin>(&mut self, w: &mut W, buf: &[u8], pos: usize) -> std::io::Result<()> {
        if self.copying {
            if !self.out.is_empty() {
                w.write_all(&self.out).await?;
            }
            if self.out.capacity() > SHRINK_ABOVE {
                self.out = BytesMut::new();
            } else {
                self.out.clear();
            }
            self.copying = false;
        } else if pos > 0 {
            w.write_all(&buf[..pos]).await?;
        }
        Ok(())
    }
}

/// A read buffer that gives back what it grew to for one large message once that
/// message is through, so an idle session keeps [`READ_CHUNK`], not its largest message.
struct ReadBuf {
    buf: BytesMut,
    /// Grown past [`SHRINK_ABOVE`] since last released. (`BytesMut::capacity` counts
    /// from the read position only, so it cannot tell.)
    grown: bool,
}

impl ReadBuf {
    fn new() -> Self {
        Self {
            buf: BytesMut::with_capacity(READ_CHUNK),
            grown: false,
        }
    }

    /// Drops the first `n` bytes, releasing the allocation once it is empty and grown.
    fn consume(&mut self, n: usize) {
        if self.grown && n == self.buf.len() {
            self.buf = BytesMut::with_capacity(READ_CHUNK);
            self.grown = false;
        } else {
            self.buf.advance(n);
            // Emptied: the next read lands at the start of the allocation again (no copy,
            // nothing is left), so a session of small messages touches the same few cache
            // lines each time instead of sweeping its whole buffer between reclaims.
            if self.buf.is_empty() {
                self.buf.reserve(READ_CHUNK);
            }
        }
    }

    /// Makes room for `need` more bytes of a message read whole.
    fn reserve(&mut self, need: usize) {
        if need > 0 {
            self.grown |= self.buf.len() + need > SHRINK_ABOVE;
            self.buf.reserve(need);
        }
    }

    /// Reads what `r` has; 0 at its end.
    async fn fill<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> std::io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.reserve(READ_CHUNK);
        }
        r.read_buf(&mut self.buf).await
    }
}

/// Client to upstream. Cancel safe: no (a partly written batch is lost), but
/// the session ends whenever it is dropped.
///
/// It ends when the client's side does: after forwarding a Terminate, or, at the end of
/// the client's input or a protocol violation, after forwarding what came before and
/// closing the upstream's sending side. Either way Postgres still owes replies to what
/// it was sent; the session relays them until the upstream closes.
///
/// `room` wakes it when it waits for replies to bring the units in flight down (see
/// [`MAX_PENDING`]).
pub async fn client_to_upstream<R, W>(
    cr: &mut R,
    uw: &mut W,
    shared: &Mutex<Shared>,
    room: &Notify,
    disp: &mut Dispatcher,
    max_message: usize,
) -> End
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut rb = ReadBuf::new();
    let mut em = Emitter::new();
    let mut stream = 0usize;
    // The message at the front of `rb` had its text analysed apart (see below).
    let mut analysed_apart = false;
    loop {
        let mut pos = 0;
        let mut terminated = false;
        let mut violation = None;
        let mut need = 0;
        let mut full;
        let mut analyse_apart = false;
        {
            let mut st = shared.lock().unwrap_or_else(|p| p.into_inner());
            while pos < rb.buf.len() {
                if stream > 0 {
                    let n = stream.min(rb.buf.len() - pos);
                    em.forward(&rb.buf, pos, pos + n);
                    pos += n;
                    stream -= n;
                    continue;
                }
                let h = match peek_header(&rb.buf[pos..]) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        violation = Some(e.to_string());
                        break;
                    }
                };
                let total = h.total_len();
                if h.body_len + 4 > PG_MESSAGE_LIMIT {
                    // Postgres would drop the connection without a word; say why.
                    violation = Some(format!(
                        "message type '{}' of {} bytes exceeds the protocol's limit",
                        shown(h.tag),
                        h.body_len
                    ));
                    break;
                }
                if st.copy_in && !matches!(h.tag, b'd' | b'c' | b'f' | b'S' | b'H' | b'X') {
                    // Postgres fails the COPY on the type byte alone (08P01 "unexpected message
                    // type", then FATAL: it was reading a message): it gets the header and
                    // says so itself, and the session ends after its answer.
                    em.forward(&rb.buf, pos, pos + HEADER_LEN);
                    pos += HEADER_LEN;
                    violation = Some(format!("message type '{}' during COPY FROM STDIN", shown(h.tag)));
                    break;
                }
                let whole = match h.tag {
                    b'Q' | b'P' if h.body_len > max_message => {
                        violation = Some(format!("message of {} bytes exceeds max_message_size", h.body_len));
                        break;
                    }
                    b'Q' | b'P' => total,
                    b'B' => total.min(HEADER_LEN + BIND_PREFIX),
                    b'E' | b'C' | b'D' | b'S' | b'H' | b'X' if h.body_len > SMALL_MESSAGE => {
                        violation = Some(format!("message type '{}' too long", shown(h.tag)));
                        break;
                    }
                    b'E' | b'C' | b'D' | b'S' | b'H' | b'X' => total,
                    // Everything else streams; only its header is looked at.
                    _ => HEADER_LEN,
                };
                if rb.buf.len() - pos < whole {
                    need = whole - (rb.buf.len() - pos);
                    break;
                }
                if whole > ANALYSE_APART && matches!(h.tag, b'Q' | b'P') && !analysed_apart && !st.copy_in {
                    // Its text is analysed first, away from this thread's other sessions.
                    analyse_apart = true;
                    break;
                }
                disp.resync(&st);
                let msg = &rb.buf[pos..pos + whole];
                let handled = if whole > ANALYSE_APART {
                    off_worker(|| handle_client_message(h.tag, msg, total, &mut st, disp))
                } else {
                    handle_client_message(h.tag, msg, total, &mut st, disp)
                };
                if std::mem::take(&mut analysed_apart) {
                    disp.forget_ready();
                }
                st.drop_skipped();
                match handled {
                    Ok(Action::Forward) => {}
                    Ok(Action::Replace(bytes)) => {
                        em.insert(&rb.buf, pos, &bytes);
                        em.skip(&rb.buf, pos);
                        pos += total;
                        continue;
                    }
                    Ok(Action::Prefix(bytes)) => em.insert(&rb.buf, pos, &bytes),
                    Ok(Action::Terminate) => terminated = true,
                    Err(reason) => {
                        violation = Some(reason);
                        break;
                    }
                }
                stream = total;
                if terminated {
                    let n = stream.min(rb.buf.len() - pos);
                    em.forward(&rb.buf, pos, pos + n);
                    pos += n;
                    break;
                }
            }
            full = false;
            if st.pending.len() >= MAX_PENDING {
                let (awaiting, copy_ends) = st.in_flight();
                full = awaiting >= MAX_PENDING;
                if copy_ends > MAX_COPY_ENDS && violation.is_none() {
                    violation = Some(format!(
                        "more than {MAX_COPY_ENDS} CopyDone or CopyFail messages sent before Postgres began a COPY"
                    ));
                }
            }
            st.reader_waiting = full;
        }
        // What came before a violation still goes: Postgres would run it before reading
        // the message that breaks the session.
        if let Err(e) = em.flush(uw, &rb.buf, pos).await {
            return End::Io(e);
        }
        rb.consume(pos);
        if terminated {
            return End::ClientTerminated;
        }
        if let Some(reason) = violation {
            // Postgres answers what it was sent, then ends the session at the end of its input.
            let _ = uw.shutdown().await;
            return End::ClientProtocol(reason);
        }
        if analyse_apart {
            // The long message is now at the front of `rb`, whole.
            let scs = shared
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .reported
                .standard_conforming_strings;
            if let Some(sql) = statement_text(&rb.buf) {
                disp.analyze_apart(sql, scs).await;
            }
            analysed_apart = true;
            continue;
        }
        while full {
            room.notified().await;
            let mut st = shared.lock().unwrap_or_else(|p| p.into_inner());
            full = !st.may_resume();
            st.reader_waiting = full;
        }
        rb.reserve(need);
        match rb.fill(cr).await {
            Ok(0) => {
                // The client may have closed only its sending side: Postgres answers what it
                // was sent, as it would to the client directly, and ends at the end of its input.
                let _ = uw.shutdown().await;
                return End::ClientGone;
            }
            Ok(_) => {}
            Err(e) => return End::Io(e),
        }
    }
}

/// The statement text of the Query or Parse message `msg` (header included), as the
/// dispatcher reads it.
fn statement_text(msg: &[u8]) -> Option<String> {
    let mut body = Body::new(msg.get(HEADER_LEN..)?);
    if msg[0] == b'P' {
        body.cstr()?;
    }
    Some(String::from_utf8_lossy(body.cstr()?).into_owned())
}

enum Action {
    Forward,
    /// Send these bytes instead of the message.
    Replace(BytesMut),
    /// Send these bytes before the message.
    Prefix(BytesMut),
    Terminate,
}

/// One client message; `msg` holds the header and the inspected body bytes.
fn handle_client_message(
    tag: u8,
    msg: &[u8],
    total: usize,
    st: &mut Shared,
    disp: &mut Dispatcher,
) -> Result<Action, String> {
    let malformed = || format!("malformed message type '{}'", shown(tag));
    let mut body = Body::new(&msg[HEADER_LEN..]);
    match tag {
        b'Q' => {
            let sql = body.cstr().ok_or_else(malformed)?;
            if !body.rest().is_empty() {
                return Err(malformed());
            }
            let text = utf8_text(sql);
            let exact = matches!(text, Cow::Borrowed(_));
            let new = disp.on_query(st, &text, exact);
            let mut out = BytesMut::new();
            if let Some(prefix) = disp.take_query_prefix() {
                crate::protocol::codec::query(&mut out, &prefix);
            }
            let Some(new) = new else {
                return Ok(if out.is_empty() {
                    Action::Forward
                } else {
                    Action::Prefix(out)
                });
            };
            if HEADER_LEN + new.len() + 1 > PG_MESSAGE_LIMIT {
                // Only with max_message_size near its 1 GiB ceiling and a text of many
                // short fenced writes, each of which gets a guard.
                return Err("the query with pgfence's guards exceeds the protocol's message limit".into());
            }
            out.reserve(new.len() + 6);
            crate::protocol::codec::query(&mut out, &new);
            Ok(Action::Replace(out))
        }
        b'P' => {
            let name = body.cstr().ok_or_else(malformed)?;
            let key = key(st, name);
            let sql = body.cstr().ok_or_else(malformed)?;
            let params = body.rest();
            let text = utf8_text(sql);
            let exact = matches!(text, Cow::Borrowed(_));
            let Some(new) = disp.on_parse(st, &key, name, &text, params, exact) else {
                return Ok(Action::Forward);
            };
            let mut out = BytesMut::with_capacity(new.len() + name.len() + params.len() + 8);
            out.put_u8(b'P');
            out.put_i32((4 + name.len() + 1 + new.len() + 1 + params.len()) as i32);
            out.put_slice(name);
            out.put_u8(0);
            out.put_slice(new.as_bytes());
            out.put_u8(0);
            out.put_slice(params);
            Ok(Action::Replace(out))
        }
        b'B' => {
            let portal = body.cstr();
            let statement = body.cstr();
            let mut out = BytesMut::new();
            match (portal, statement) {
                (Some(p), Some(s)) => {
                    let (p, s) = (key(st, p), key(st, s));
                    disp.on_bind(st, &p, &s, &mut out)
                }
                // Names longer than the part read: Postgres keys each by its first 63 bytes.
                _ if msg.len() < total => {
                    let (portal, rest) = leading_name(&msg[HEADER_LEN..]).ok_or_else(malformed)?;
                    let portal = key(st, portal);
                    let statement = match rest.and_then(leading_name) {
                        Some((s, _)) => key(st, s),
                        // It starts beyond what was read: it may be any.
                        None => Cow::Borrowed(names::UNCERTAIN),
                    };
                    disp.on_bind(st, &portal, &statement, &mut out)
                }
                _ => return Err(malformed()),
            }
            Ok(if out.is_empty() {
                Action::Forward
            } else {
                Action::Prefix(out)
            })
        }
        b'E' => {
            let portal = body.cstr().ok_or_else(malformed)?;
            body.i32().ok_or_else(malformed)?;
            let mut out = BytesMut::new();
            let portal = key(st, portal);
            disp.on_execute(st, &portal, &mut out);
            Ok(if out.is_empty() {
                Action::Forward
            } else {
                Action::Prefix(out)
            })
        }
        b'C' | b'D' => {
            let kind = body.u8().ok_or_else(malformed)?;
            let name = body.cstr().ok_or_else(malformed)?;
            if !matches!(kind, b'S' | b'P') {
                return Err(malformed());
            }
            let name = key(st, name);
            if tag == b'C' {
                disp.on_close(st, kind, &name);
            } else {
                disp.on_describe(st, kind, &name);
            }
            Ok(Action::Forward)
        }
        // Postgres answers a Sync or Flush with a body by an error where pgfence counts on
        // a ReadyForQuery or on nothing; in COPY it ignores the body.
        b'S' | b'H' if !st.copy_in && !body.rest().is_empty() => Err(malformed()),
        b'S' => {
            disp.on_sync(st);
            Ok(Action::Forward)
        }
        b'F' => {
            disp.on_function_call(st);
            Ok(Action::Forward)
        }
        b'c' | b'f' => {
            disp.on_copy_end(st);
            Ok(Action::Forward)
        }
        b'd' => {
            disp.on_copy_data(st);
            Ok(Action::Forward)
        }
        b'X' => Ok(Action::Terminate),
        _ => Ok(Action::Forward),
    }
}

/// A statement text as a `str`: borrowed when it is valid UTF-8 (`from_utf8` checks that
/// faster than `from_utf8_lossy`), else a copy with each invalid sequence replaced, which
/// the caller treats as inexact (another `client_encoding`).
fn utf8_text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// A message type byte as the log and a FATAL message show it: escaped unless printable ASCII.
fn shown(tag: u8) -> std::ascii::EscapeDefault {
    std::ascii::escape_default(tag)
}

/// The name at the start of `bytes` and what follows its NUL; when the NUL is not among
/// them, the name's first 63 bytes (all of it that Postgres keys) and nothing after.
fn leading_name(bytes: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    match memchr::memchr(0, bytes) {
        Some(i) => Some((&bytes[..i], Some(&bytes[i + 1..]))),
        None => bytes.get(..MAX_IDENT_BYTES).map(|name| (name, None)),
    }
}

/// A protocol statement or portal name as pgfence keys it (see [`names`]).
fn key<'a>(st: &Shared, name: &'a [u8]) -> Cow<'a, str> {
    names::protocol_key(name, st.reported.server, st.reported.client, || {
        st.settings_may_change()
    })
}

/// Upstream to client. Cancel safe: no (see [`client_to_upstream`]). `mid_message` is
/// true while what the client got may end inside a message (a streamed one not yet
/// through, or a write cut short): nothing of pgfence's own may follow it then.
pub async fn upstream_to_client<R, W>(
    ur: &mut R,
    cw: &mut W,
    shared: &Mutex<Shared>,
    room: &Notify,
    mid_message: &AtomicBool,
) -> End
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut rb = ReadBuf::new();
    let mut em = Emitter::new();
    // Bytes of the current message still to come, and whether they are forwarded.
    let mut stream = (0usize, true);
    let mut last_error = false;
    loop {
        let mut pos = 0;
        let mut need = 0;
        let drained;
        let violation;
        {
            let mut st = shared.lock().unwrap_or_else(|p| p.into_inner());
            while pos < rb.buf.len() {
                if stream.0 > 0 {
                    let n = stream.0.min(rb.buf.len() - pos);
                    if stream.1 {
                        em.forward(&rb.buf, pos, pos + n);
                    } else {
                        em.skip(&rb.buf, pos);
                    }
                    pos += n;
                    stream.0 -= n;
                    continue;
                }
                let h = match peek_header(&rb.buf[pos..]) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(_) => return End::UpstreamProtocol,
                };
                let total = h.total_len();
                last_error = h.tag == b'E';
                if matches!(h.tag, b'Z' | b'C' | b'E' | b'S' | b't') && h.body_len <= SERVER_INSPECT {
                    if rb.buf.len() - pos < total {
                        need = total - (rb.buf.len() - pos);
                        break;
                    }
                    match st.on_server_message(h.tag, Some(&rb.buf[pos + HEADER_LEN..pos + total])) {
                        Verdict::Forward => em.forward(&rb.buf, pos, pos + total),
                        Verdict::Swallow => em.skip(&rb.buf, pos),
                        Verdict::Replace(bytes) => em.insert(&rb.buf, pos, &bytes),
                    }
                    pos += total;
                } else {
                    let forward = match st.on_server_message(h.tag, None) {
                        Verdict::Forward => true,
                        Verdict::Swallow => false,
                        Verdict::Replace(bytes) => {
                            em.insert(&rb.buf, pos, &bytes);
                            false
                        }
                    };
                    stream = (total, forward);
                }
                if st.violation.is_some() {
                    break;
                }
            }
            drained = st.draining && st.drainable() && stream.0 == 0;
            violation = st.violation.take();
            if st.reader_waiting && st.may_resume() {
                st.reader_waiting = false;
                room.notify_one();
            }
        }
        mid_message.store(true, Ordering::Relaxed);
        if let Some(reason) = violation {
            // What came before the message that broke the session is the client's; it
            // ends where that message starts.
            if em.flush(cw, &rb.buf, pos).await.is_ok() {
                mid_message.store(false, Ordering::Relaxed);
            }
            return End::ClientProtocol(reason);
        }
        if let Err(e) = em.flush(cw, &rb.buf, pos).await {
            return End::Io(e);
        }
        // A forwarded message still streaming has been written in part.
        mid_message.store(stream.0 > 0 && stream.1, Ordering::Relaxed);
        rb.consume(pos);
        if drained {
            return End::Drained;
        }
        rb.reserve(need);
        match rb.fill(ur).await {
            Ok(0) => {
                return End::UpstreamGone {
                    after_error: last_error,
                };
            }
            Ok(_) => {}
            Err(e) => return End::Io(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{duplex, split};

    use super::*;
    use crate::session::context::DbFences;
    use crate::session::declare::Declarations;

    /// A long text's analysis does not hold up the other sessions of its worker thread:
    /// with one worker, a task spawned beside it still runs while it works. (Run in place,
    /// `f` would wait for that task forever; the wait gives up after 10 s.)
    #[test]
    fn long_work_hands_the_worker_to_other_sessions() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let done = rt.block_on(async {
            let (tx, rx) = std::sync::mpsc::channel();
            let long = tokio::spawn(async move { off_worker(|| rx.recv_timeout(Duration::from_secs(10)).is_ok()) });
            tokio::task::yield_now().await;
            let other = tokio::spawn(async move { tx.send(()).unwrap() });
            other.await.unwrap();
            long.await.unwrap()
        });
        assert!(done);
        // On a single-threaded runtime it just runs.
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(rt.block_on(async { off_worker(|| 7) }), 7);
    }

    /// Small messages read one after another land at the start of the buffer each time;
    /// a message split over reads keeps its first part in place.
    #[tokio::test]
    async fn a_read_buffer_emptied_reads_into_its_start_again() {
        use tokio::io::AsyncWriteExt;
        let (mut tx, mut rx) = duplex(64 * 1024);
        let mut rb = ReadBuf::new();
        let start = rb.buf.as_ptr();
        for _ in 0..200 {
            tx.write_all(&[7; 100]).await.unwrap();
            assert_eq!(rb.fill(&mut rx).await.unwrap(), 100);
            assert_eq!(rb.buf.as_ptr(), start);
            rb.consume(100);
        }
        tx.write_all(&[7; 100]).await.unwrap();
        rb.fill(&mut rx).await.unwrap();
        rb.consume(60);
        assert_eq!(rb.buf.as_ptr(), start.wrapping_add(60), "40 bytes left in place");
        assert_eq!(&rb.buf[..], &[7; 40]);
    }

    const COPY_DONE: &[u8] = b"c\0\0\0\x04";
    const PARSE_COMPLETE: &[u8] = b"1\0\0\0\x04";

    /// A Parse of `SELECT 2` as the unnamed statement.
    fn parse() -> Vec<u8> {
        let body = b"\0SELECT 2\0\0\0";
        let mut m = vec![b'P'];
        m.extend(((body.len() + 4) as u32).to_be_bytes());
        m.extend(body);
        m
    }

    /// A dispatcher for a session of a database without fences.
    fn dispatcher() -> Dispatcher {
        Dispatcher::new(
            Arc::new(DbFences::for_database(Arc::from(Vec::new()), "db")),
            Declarations::default(),
        )
    }

    /// A session of the relay's two directions between a client's and Postgres' ends of two
    /// in-memory pipes, until one direction ends.
    async fn relay(client: tokio::io::DuplexStream, upstream: tokio::io::DuplexStream) -> End {
        let (mut cr, mut cw) = split(client);
        let (mut ur, mut uw) = split(upstream);
        let shared = Mutex::new(Shared::new(Declarations::default()));
        let room = Notify::new();
        let mut disp = dispatcher();
        let mid = AtomicBool::new(false);
        tokio::select! {
            end = client_to_upstream(&mut cr, &mut uw, &shared, &room, &mut disp, 1 << 20) => end,
            end = upstream_to_client(&mut ur, &mut cw, &shared, &room, &mid) => end,
        }
    }

    /// CopyDone messages sent before any COPY began are ones Postgres may never answer
    /// (here it ignores them): they must not hold up the client's Sync, without which
    /// Postgres answers nothing (it holds back its replies to Parse until then).
    #[tokio::test]
    async fn copy_dones_ahead_of_a_copy_do_not_hold_up_the_sync() {
        let (mut client, proxy_client) = duplex(1 << 20);
        let (proxy_upstream, mut upstream) = duplex(64 << 20);
        let session = tokio::spawn(relay(proxy_client, proxy_upstream));
        let mut batch = Vec::new();
        for _ in 0..41 {
            batch.extend(parse());
            batch.extend(COPY_DONE.repeat(100));
        }
        client.write_all(&batch).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.write_all(SYNC).await.unwrap();
        // Postgres: everything before the Sync arrives, then the replies.
        let mut sent = vec![0; batch.len() + SYNC.len()];
        tokio::time::timeout(Duration::from_secs(10), upstream.read_exact(&mut sent))
            .await
            .expect("the Sync reaches Postgres")
            .unwrap();
        let mut replies = PARSE_COMPLETE.repeat(41);
        replies.extend(READY);
        upstream.write_all(&replies).await.unwrap();
        let mut got = vec![0; replies.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, replies);
        session.abort();
    }

    /// Past [`MAX_COPY_ENDS`] of them, the client is refused.
    #[tokio::test]
    async fn endless_copy_dones_ahead_of_a_copy_are_refused() {
        let (mut client, proxy_client) = duplex(1 << 20);
        let (proxy_upstream, _upstream) = duplex(64 << 20);
        let session = tokio::spawn(relay(proxy_client, proxy_upstream));
        let mut batch = Vec::new();
        for _ in 0..(MAX_COPY_ENDS / 500 + 2) {
            batch.extend(parse());
            batch.extend(COPY_DONE.repeat(500));
        }
        client.write_all(&batch).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(10), session)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(&end, End::ClientProtocol(r) if r.contains("CopyDone")),
            "{end:?}"
        );
    }

    const SYNC: &[u8] = b"S\0\0\0\x04";
    const READY: &[u8] = b"Z\0\0\0\x05I";

    /// A client that pipelines without reading makes pgfence remember each message until
    /// Postgres answers it. The client side stops reading at [`MAX_PENDING`] units in
    /// flight, so that memory is bounded whatever the client sends, and resumes as replies
    /// come, so a client that does read gets every reply.
    #[tokio::test]
    async fn a_client_that_sends_without_reading_is_held_at_max_pending() {
        const SYNCS: usize = 100_000;
        let (client, proxy_client) = duplex(1 << 20);
        let (proxy_upstream, mut upstream) = duplex(64 << 20);
        let (mut cr, mut cw) = split(proxy_client);
        let (mut ur, mut uw) = split(proxy_upstream);
        let (mut client_r, mut client_w) = split(client);
        let shared = Mutex::new(Shared::new(Declarations::default()));
        let room = Notify::new();
        let mut disp = dispatcher();
        let sender = tokio::spawn(async move {
            client_w.write_all(&SYNC.repeat(SYNCS)).await.unwrap();
            client_w
        });
        let mut c2u = pin!(client_to_upstream(&mut cr, &mut uw, &shared, &room, &mut disp, 1 << 20));

        // Nothing answers: the client side stops at the cap, one read's worth past it at most.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), &mut c2u)
                .await
                .is_err()
        );
        let held = shared.lock().unwrap().pending.len();
        assert!(
            (MAX_PENDING..MAX_PENDING + READ_CHUNK).contains(&held),
            "{held} units in flight"
        );
        let mut sent = vec![0; held * SYNC.len()];
        upstream.read_exact(&mut sent).await.unwrap();
        assert_eq!(sent, SYNC.repeat(held));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), upstream.read_u8())
                .await
                .is_err()
        );

        // Postgres answers every Sync: the rest goes through and every reply reaches the client.
        let server = async {
            upstream.write_all(&READY.repeat(held)).await.unwrap();
            for _ in held..SYNCS {
                let mut sync = [0; 5];
                upstream.read_exact(&mut sync).await.unwrap();
                assert_eq!(sync, SYNC);
                upstream.write_all(READY).await.unwrap();
            }
        };
        let reader = async {
            let mut replies = vec![0; SYNCS * READY.len()];
            client_r.read_exact(&mut replies).await.unwrap();
            assert!(replies.chunks(READY.len()).all(|r| r == READY));
        };
        let mid = AtomicBool::new(false);
        let mut u2c = pin!(upstream_to_client(&mut ur, &mut cw, &shared, &room, &mid));
        let relay = async {
            tokio::select! {
                end = &mut c2u => panic!("client side ended: {end:?}"),
                end = &mut u2c => panic!("upstream side ended: {end:?}"),
            }
        };
        let answered = async { tokio::join!(server, reader) };
        tokio::select! {
            () = relay => {}
            r = tokio::time::timeout(Duration::from_secs(60), answered) => {
                r.expect("every Sync answered");
            }
        }
        assert!(shared.lock().unwrap().pending.is_empty());
        assert_eq!(shared.lock().unwrap().answered, SYNCS as u64);
        sender.await.unwrap();
    }
}
