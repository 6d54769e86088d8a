//! Message framing: every message after startup is a type byte and a
//! big-endian `i32` length that counts itself but not the type byte.
//!
//! The framer only reads headers and, for the few messages pgfence inspects,
//! the body in place. It never allocates per message.

/// Bytes in a message header (type + length).
pub const HEADER_LEN: usize = 5;

/// A parsed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The message type byte.
    pub tag: u8,
    /// Body length in bytes (the length field minus its own 4 bytes).
    pub body_len: usize,
}

impl Header {
    /// Total bytes of the message on the wire.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.body_len
    }
}

/// Why bytes could not be framed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field is below 4, which no message can have.
    #[error("invalid message length {0}")]
    BadLength(i32),
}

/// Reads the header at the start of `buf`, or `None` when fewer than 5 bytes are there.
pub fn peek_header(buf: &[u8]) -> Result<Option<Header>, FrameError> {
    let Some(head) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if len < 4 {
        return Err(FrameError::BadLength(len));
    }
    Ok(Some(Header {
        tag: head[0],
        body_len: len as usize - 4,
    }))
}

/// A cursor over a message body for reading C strings and integers, failing
/// (never panicking) on truncated or malformed input.
#[derive(Debug, Clone)]
pub struct Body<'a> {
    buf: &'a [u8],
}

impl<'a> Body<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Reads a NUL-terminated string as raw bytes.
    pub fn cstr(&mut self) -> Option<&'a [u8]> {
        let end = memchr::memchr(0, self.buf)?;
        let (s, rest) = self.buf.split_at(end);
        self.buf = &rest[1..];
        Some(s)
    }

    /// Reads a NUL-terminated UTF-8 string.
    pub fn cstr_utf8(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.cstr()?).ok()
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.buf.split_first()?;
        self.buf = rest;
        Some(b)
    }

    /// Reads a big-endian i16.
    pub fn i16(&mut self) -> Option<i16> {
        let b = self.buf.get(..2)?;
        let v = i16::from_be_bytes([b[0], b[1]]);
        self.buf = &self.buf[2..];
        Some(v)
    }

    /// Reads a big-endian i32.
    pub fn i32(&mut self) -> Option<i32> {
        let b = self.buf.get(..4)?;
        let v = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        self.buf = &self.buf[4..];
        Some(v)
    }

    /// Bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }
}

/// The type OIDs of a ParameterDescription body (`None` when it is malformed).
pub fn parameter_types(body: &[u8]) -> Option<Vec<u32>> {
    let mut r = Body::new(body);
    // Up to 65 535 parameters: the count is unsigned, though the protocol calls it Int16.
    let count = usize::from(r.i16()? as u16);
    let types = (0..count)
        .map(|_| r.i32().map(|t| t as u32))
        .collect::<Option<Vec<_>>>()?;
    r.rest().is_empty().then_some(types)
}

/// Reads the SQLSTATE (`C` field) of an ErrorResponse or NoticeResponse body.
pub fn error_code(body: &[u8]) -> Option<&[u8]> {
    error_field(body, b'C')
}

/// The value of field `which` of an ErrorResponse or NoticeResponse body.
pub fn error_field(body: &[u8], which: u8) -> Option<&[u8]> {
    let mut r = Body::new(body);
    loop {
        let field = r.u8()?;
        if field == 0 {
            return None;
        }
        let value = r.cstr()?;
        if field == which {
            return Some(value);
        }
    }
}

/// The position (`P`: 1-based, in the text Postgres received) of an ErrorResponse body.
pub fn error_position(body: &[u8]) -> Option<usize> {
    std::str::from_utf8(error_field(body, b'P')?).ok()?.parse().ok()
}

/// Whether an ErrorResponse body says the session ends (severity FATAL or PANIC; the
/// non-localised `V` field where the server sends it, else `S`).
pub fn ends_session(body: &[u8]) -> bool {
    let Some(fields) = error_fields(body) else {
        return false;
    };
    let field = |which: u8| fields.iter().find(|(f, _)| *f == which).map(|(_, v)| *v);
    matches!(field(b'V').or_else(|| field(b'S')), Some(b"FATAL" | b"PANIC"))
}

/// The fields of an ErrorResponse or NoticeResponse body, in order; `None` when malformed.
fn error_fields(body: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut fields = Vec::new();
    let mut r = Body::new(body);
    loop {
        let field = r.u8()?;
        if field == 0 {
            return Some(fields);
        }
        fields.push((field, r.cstr()?));
    }
}

/// The whole ErrorResponse message (type byte and length included) with these fields.
fn error_message(fields: &[(u8, &[u8])]) -> Option<bytes::BytesMut> {
    let len = 4 + fields.iter().map(|(_, v)| v.len() + 2).sum::<usize>() + 1;
    let mut out = bytes::BytesMut::with_capacity(len + 1);
    out.extend_from_slice(b"E");
    out.extend_from_slice(&i32::try_from(len).ok()?.to_be_bytes());
    for (field, value) in fields {
        out.extend_from_slice(&[*field]);
        out.extend_from_slice(value);
        out.extend_from_slice(&[0]);
    }
    out.extend_from_slice(&[0]);
    Some(out)
}

/// The whole ErrorResponse message (type byte and length included) of `body` without
/// the fields that say where inside the server it was raised: `W` (CONTEXT), `q` and `p`
/// (the internal query and a position in it). `None` when it has none of them or is
/// malformed.
pub fn error_without_context(body: &[u8]) -> Option<bytes::BytesMut> {
    let mut fields = error_fields(body)?;
    let before = fields.len();
    fields.retain(|(field, _)| !is_context(*field));
    if fields.len() == before {
        return None;
    }
    error_message(&fields)
}

/// Whether an error field says where inside the server the error was raised: `W`
/// (CONTEXT), `q` and `p` (the internal query and a position in it).
fn is_context(field: u8) -> bool {
    matches!(field, b'W' | b'q' | b'p')
}

/// Whether an ErrorResponse body was raised inside pgfence's guard: the outermost frame
/// of its CONTEXT (the last line) is a guard function's. A lock or statement timeout, a
/// cancel, a deadlock or a serialization failure met while the guard waits or reads.
/// Frames are matched in Postgres' English wording; under another `lc_messages` nothing
/// matches.
pub fn raised_in_guard(body: &[u8]) -> bool {
    let Some(context) = error_field(body, b'W') else {
        return false;
    };
    let outermost = context.rsplit(|&b| b == b'\n').next().unwrap_or_default();
    outermost.starts_with(b"PL/pgSQL function pgfence.guard") || outermost.starts_with(b"SQL function \"guard")
}

/// The whole ErrorResponse message of `body` raised to severity FATAL (`S` and `V`), without
/// the fields that say where inside the server it was raised (as
/// [`error_without_context`]). `None` when malformed.
pub fn error_as_fatal(body: &[u8]) -> Option<bytes::BytesMut> {
    let mut fields = error_fields(body)?;
    fields.retain(|(field, _)| !is_context(*field));
    for (field, value) in &mut fields {
        if matches!(field, b'S' | b'V') {
            *value = b"FATAL";
        }
    }
    error_message(&fields)
}

/// The whole ErrorResponse message of `body` with its position (`P`) given by `map`
/// from the one Postgres gave. `None` when it has no position, `map` leaves it as it
/// is, or the body is malformed.
pub fn error_with_position(body: &[u8], map: impl FnOnce(usize) -> usize) -> Option<bytes::BytesMut> {
    let mut fields = error_fields(body)?;
    let (index, value) = fields
        .iter()
        .enumerate()
        .find_map(|(i, (f, v))| (*f == b'P').then_some((i, *v)))?;
    let sent: usize = std::str::from_utf8(value).ok()?.parse().ok()?;
    let client = map(sent);
    if client == sent {
        return None;
    }
    let client = client.to_string();
    fields[index].1 = client.as_bytes();
    error_message(&fields)
}

/// `Some(encoding)` when a ParameterStatus body reports `server_encoding` (`Some(true, …)`)
/// or `client_encoding` (`Some(false, …)`).
pub fn encoding(body: &[u8]) -> Option<(bool, &[u8])> {
    let mut r = Body::new(body);
    let server = match r.cstr()? {
        b"server_encoding" => true,
        b"client_encoding" => false,
        _ => return None,
    };
    Some((server, r.cstr()?))
}

/// `Some(on)` when a ParameterStatus body reports `standard_conforming_strings`,
/// which decides where string literals end for the rest of the session.
pub fn standard_conforming_strings(body: &[u8]) -> Option<bool> {
    let mut r = Body::new(body);
    (r.cstr()? == b"standard_conforming_strings").then(|| r.cstr() != Some(b"off"))
}

/// `Some(hides)` when a ParameterStatus body reports `client_encoding`: whether that
/// encoding has multibyte characters whose last byte can be 0x5C, a backslash in ASCII
/// but not to Postgres, which converts the text before reading it. Those are the encodings
/// Postgres accepts only from clients (BIG5, GB18030, GBK, JOHAB, SJIS, SHIFT_JIS_2004, UHC).
pub fn client_encoding_hides_backslash(body: &[u8]) -> Option<bool> {
    let mut r = Body::new(body);
    if r.cstr()? != b"client_encoding" {
        return None;
    }
    let name = r.cstr()?.to_ascii_uppercase();
    Some(matches!(
        name.as_slice(),
        b"BIG5" | b"GB18030" | b"GBK" | b"JOHAB" | b"SJIS" | b"SHIFT_JIS_2004" | b"UHC"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_types_are_read_whole_or_not_at_all() {
        let body = |count: u16, types: &[u32]| {
            let mut b = count.to_be_bytes().to_vec();
            types.iter().for_each(|t| b.extend_from_slice(&t.to_be_bytes()));
            b
        };
        assert_eq!(parameter_types(&body(2, &[23, 20])), Some(vec![23, 20]));
        assert_eq!(parameter_types(&body(0, &[])), Some(vec![]));
        // The count is unsigned: 65 535 parameters.
        let many = vec![25; 65_535];
        assert_eq!(parameter_types(&body(65_535, &many)), Some(many));
        assert_eq!(parameter_types(&body(3, &[23, 20])), None, "short");
        assert_eq!(parameter_types(&body(1, &[23, 20])), None, "trailing bytes");
        assert_eq!(parameter_types(&[0]), None);
    }

    #[test]
    fn an_error_that_ends_the_session_is_known_by_its_severity() {
        let err = |fields: &[(u8, &str)]| {
            let mut b = Vec::new();
            for (f, v) in fields {
                b.push(*f);
                b.extend_from_slice(v.as_bytes());
                b.push(0);
            }
            b.push(0);
            b
        };
        assert!(ends_session(&err(&[(b'S', "FATAL"), (b'C', "57P01")])));
        assert!(ends_session(&err(&[(b'S', "PANIK"), (b'V', "PANIC")])));
        assert!(!ends_session(&err(&[(b'S', "FATAL"), (b'V', "ERROR")])));
        assert!(!ends_session(&err(&[(b'S', "ERROR"), (b'C', "42883")])));
        assert!(!ends_session(b"S"));
    }

    #[test]
    fn error_with_position_changes_only_the_position() {
        let body = b"SERROR\0C42601\0Msyntax error at or near \"SELEC\"\0P97\0Fscan.l\0\0";
        let out = error_with_position(body, |p| p - 47).unwrap();
        let expect = b"SERROR\0C42601\0Msyntax error at or near \"SELEC\"\0P50\0Fscan.l\0\0";
        assert_eq!(&out[..1], b"E");
        assert_eq!(&out[1..5], &(expect.len() as i32 + 4).to_be_bytes());
        assert_eq!(&out[5..], expect);
        assert!(error_with_position(body, |p| p).is_none());
        assert!(error_with_position(b"SERROR\0C42601\0\0", |p| p + 1).is_none());
        assert!(error_with_position(b"SERROR\0Pxx\0\0", |p| p + 1).is_none());
    }

    #[test]
    fn error_without_context_keeps_every_other_field() {
        let body = b"SERROR\0CPF001\0Mstale\0Hhint\0Wfunction guard line 5\0qSELECT 1\0p3\0Fpl_exec.c\0\0";
        let out = error_without_context(body).unwrap();
        let kept = b"SERROR\0CPF001\0Mstale\0Hhint\0Fpl_exec.c\0\0";
        assert_eq!(&out[..1], b"E");
        assert_eq!(&out[1..5], &(kept.len() as i32 + 4).to_be_bytes());
        assert_eq!(&out[5..], kept);
        // Nothing to drop, or malformed: left as it is.
        assert_eq!(error_without_context(kept), None);
        assert_eq!(error_without_context(b"SERROR\0Wunterminated"), None);
    }

    #[test]
    fn client_encodings_that_hide_a_backslash() {
        for (name, hides) in [
            ("UTF8", false),
            ("SJIS", true),
            ("BIG5", true),
            ("LATIN1", false),
            ("EUC_JP", false),
            ("gbk", true),
        ] {
            let body = [b"client_encoding\0".as_slice(), name.as_bytes(), b"\0"].concat();
            assert_eq!(client_encoding_hides_backslash(&body), Some(hides), "{name}");
        }
        assert_eq!(client_encoding_hides_backslash(b"DateStyle\0ISO\0"), None);
    }

    #[test]
    fn header_needs_five_bytes() {
        assert_eq!(peek_header(b"Q\0\0\0").unwrap(), None);
        assert_eq!(
            peek_header(b"Q\0\0\0\x09abc").unwrap(),
            Some(Header { tag: b'Q', body_len: 5 })
        );
    }

    #[test]
    fn negative_and_tiny_lengths_are_errors() {
        assert_eq!(peek_header(b"Q\xff\xff\xff\xff"), Err(FrameError::BadLength(-1)));
        assert_eq!(peek_header(b"Q\0\0\0\x03"), Err(FrameError::BadLength(3)));
    }

    #[test]
    fn body_reader_fails_on_truncation() {
        let mut r = Body::new(b"abc");
        assert_eq!(r.cstr(), None);
        let mut r = Body::new(b"ab\0\x00\x01");
        assert_eq!(r.cstr(), Some(&b"ab"[..]));
        assert_eq!(r.i32(), None);
        assert_eq!(r.i16(), Some(1));
    }

    #[test]
    fn standard_conforming_strings_is_read_from_parameter_status() {
        assert_eq!(
            standard_conforming_strings(b"standard_conforming_strings\0off\0"),
            Some(false)
        );
        assert_eq!(
            standard_conforming_strings(b"standard_conforming_strings\0on\0"),
            Some(true)
        );
        assert_eq!(standard_conforming_strings(b"TimeZone\0UTC\0"), None);
    }

    #[test]
    fn error_code_is_found() {
        assert_eq!(error_code(b"SERROR\0C42P01\0Mx\0\0"), Some(&b"42P01"[..]));
        assert_eq!(error_code(b"SERROR\0Mx\0\0"), None);
        assert_eq!(error_code(b"SERR"), None);
    }

    #[test]
    fn errors_raised_in_the_guard_are_told_by_their_outermost_frame() {
        let lock = b"SERROR\0C55P03\0Mcanceling statement due to lock timeout\0WSQL statement \"SELECT \
                     pg_advisory_xact_lock(pgfence.lock_key(p_fence))\"\nPL/pgSQL function guard_full(text,bigint,text,\
                     boolean) line 90 at PERFORM\nSQL statement \"SELECT pgfence.guard_full(p_fence, p_epoch, \
                     p_lease_table, p_keep_hwm)\"\nPL/pgSQL function pgfence.guard_slow(text,bigint,text,boolean) \
                     line 67 at PERFORM\0\0";
        assert!(raised_in_guard(lock));
        assert!(raised_in_guard(
            b"SERROR\0C40001\0Mx\0WSQL function \"guard_lease\" statement 1\0\0"
        ));
        // A client's function, a trigger on the lease table, no CONTEXT: the client's own.
        assert!(!raised_in_guard(
            b"SERROR\0C55P03\0Mx\0WPL/pgSQL function pgfence.guard_slow(text) line 1\nPL/pgSQL function f() line 2\0\0"
        ));
        assert!(!raised_in_guard(
            b"SERROR\0C55P03\0Mx\0WPL/pgSQL function pgfence.lease_trigger() line 9 at PERFORM\0\0"
        ));
        assert!(!raised_in_guard(b"SERROR\0C55P03\0Mx\0\0"));
    }

    #[test]
    fn an_error_raised_to_fatal_keeps_its_code_and_text() {
        let fatal = error_as_fatal(b"SFEHLER\0VERROR\0CPF003\0Mm\0Hh\0Wctx\0\0").unwrap();
        assert_eq!(&fatal[..], &b"E\0\0\0\x20SFATAL\0VFATAL\0CPF003\0Mm\0Hh\0\0"[..]);
        assert_eq!(error_as_fatal(b"SERROR\0Mm"), None);
    }
}
