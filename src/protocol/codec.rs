//! Messages pgfence builds itself, encoded with `pgwire::messages`.
//!
//! Only messages pgfence originates are built here: errors it raises, the
//! BackendKeyData it hands out, and the guard calls it injects upstream.
//! Messages it relays are never decoded and re-encoded (see `FACTS.md`:
//! pgwire's decoders convert text lossily).

use bytes::{BufMut, Bytes, BytesMut};
use pgwire::messages::Message;
use pgwire::messages::extendedquery::{
    Bind, Close, Execute, Parse, TARGET_TYPE_BYTE_PORTAL, TARGET_TYPE_BYTE_STATEMENT,
};
use pgwire::messages::response::ErrorResponse;
use pgwire::messages::startup::{BackendKeyData, NegotiateProtocolVersion, SecretKey};

/// Appends an ErrorResponse (`S`, `V`, `C`, `M` and optionally `H` fields).
pub fn error_response(out: &mut BytesMut, severity: &str, code: &str, message: &str, hint: Option<&str>) {
    let mut fields = vec![
        (b'S', severity.to_owned()),
        (b'V', severity.to_owned()),
        (b'C', code.to_owned()),
        (b'M', strip_nul(message)),
    ];
    if let Some(h) = hint {
        fields.push((b'H', strip_nul(h)));
    }
    encode(out, &ErrorResponse::new(fields));
}

/// Appends a BackendKeyData message.
pub fn backend_key_data(out: &mut BytesMut, pid: i32, secret: i32) {
    encode(out, &BackendKeyData::new(pid, SecretKey::I32(secret)));
}

/// Appends a NegotiateProtocolVersion message offering protocol 3.`newest_minor`.
///
/// The docs call the first field the "newest minor protocol version", but Postgres sends the
/// whole version number (`major << 16 | minor`, see `SendNegotiateProtocolVersion`), and libpq 18
/// checks it as such: a bare minor of 0 reads as a "downgrade to pre-3.0 protocol version" and
/// the connection fails.
pub fn negotiate_protocol_version(out: &mut BytesMut, newest_minor: u16, unsupported: Vec<String>) {
    let version = (3 << 16) | i32::from(newest_minor);
    encode(out, &NegotiateProtocolVersion::new(version, unsupported));
}

/// Appends a Parse of a named statement with the given parameter types.
pub fn parse(out: &mut BytesMut, name: &str, sql: &str, type_oids: Vec<u32>) {
    encode(out, &Parse::new(Some(name.to_owned()), sql.to_owned(), type_oids));
}

/// Appends a Bind of `statement` to `portal` with text-format parameters.
pub fn bind_text(out: &mut BytesMut, portal: &str, statement: &str, params: &[Option<&str>]) {
    let params = params
        .iter()
        .map(|p| p.map(|s| Bytes::copy_from_slice(s.as_bytes())))
        .collect();
    encode(
        out,
        &Bind::new(
            Some(portal.to_owned()),
            Some(statement.to_owned()),
            vec![],
            params,
            vec![],
        ),
    );
}

/// Appends an Execute of `portal` fetching all rows.
pub fn execute(out: &mut BytesMut, portal: &str) {
    encode(out, &Execute::new(Some(portal.to_owned()), 0));
}

/// Appends a Close of a portal.
pub fn close_portal(out: &mut BytesMut, portal: &str) {
    encode(out, &Close::new(TARGET_TYPE_BYTE_PORTAL, Some(portal.to_owned())));
}

/// Appends a Close of a prepared statement.
pub fn close_statement(out: &mut BytesMut, statement: &str) {
    encode(out, &Close::new(TARGET_TYPE_BYTE_STATEMENT, Some(statement.to_owned())));
}

/// Appends a simple Query message.
pub fn query(out: &mut BytesMut, sql: &str) {
    out.put_u8(b'Q');
    out.put_i32((4 + sql.len() + 1) as i32);
    out.put_slice(sql.as_bytes());
    out.put_u8(0);
}

/// Encoding into a BytesMut cannot fail for the small messages built here;
/// pgwire only errs beyond its size limits, which these never reach.
fn encode<M: Message>(out: &mut BytesMut, msg: &M) {
    if let Err(e) = msg.encode(out) {
        tracing::error!(error = %e, "failed to encode a message");
    }
}

/// C strings cannot hold NUL; a message containing one would corrupt the frame.
fn strip_nul(s: &str) -> String {
    s.replace('\0', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_response_layout() {
        let mut out = BytesMut::new();
        error_response(&mut out, "FATAL", "08P01", "bad", None);
        let expected: &[u8] = b"E\0\0\0\x1fSFATAL\0VFATAL\0C08P01\0Mbad\0\0";
        assert_eq!(&out[..], expected);
    }

    #[test]
    fn negotiate_protocol_version_carries_the_whole_version_number() {
        let mut out = BytesMut::new();
        negotiate_protocol_version(&mut out, 0, vec!["_pq_.x".into()]);
        // Postgres answers a 3.2 (or `_pq_.`) startup with 0x00030000, not 0: libpq 18 refuses 0.
        let expected: &[u8] = b"v\0\0\0\x13\0\x03\0\0\0\0\0\x01_pq_.x\0";
        assert_eq!(&out[..], expected);
    }

    #[test]
    fn query_layout() {
        let mut out = BytesMut::new();
        query(&mut out, "SELECT 1");
        assert_eq!(&out[..], b"Q\0\0\0\x0dSELECT 1\0");
    }
}
