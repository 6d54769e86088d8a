//! Statement and portal names as Postgres keys them.
//!
//! Postgres converts a name from the client's encoding to the database's, then keys
//! prepared statements and portals by the first 63 bytes of that (a protocol name is
//! cut at the 63rd byte; an SQL identifier at the last whole character before it).
//! pgfence keys a name by the bytes Postgres keys it by, which it knows when they are
//! the client's own: ASCII names, and every protocol name while the database's encoding
//! is the client's or `SQL_ASCII` (an SQL name only for a UTF8 client in a UTF8 database,
//! see [`ident_uncertain`]). A key is then the same whatever `client_encoding` the
//! session had when it sent the name. Any other name with a non-ASCII byte is
//! [`UNCERTAIN`]: whatever runs under it may write any fence, and a definition or Bind
//! under it may have replaced any name that is not ASCII.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::sql::lex::MAX_IDENT_BYTES;

/// The key of every name whose Postgres key pgfence cannot know. It holds a NUL, which
/// no name on the wire or in SQL holds, so no other name has it.
pub const UNCERTAIN: &str = "\0uncertain";

/// An encoding, as Postgres names it in `server_encoding` and `client_encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `SQL_ASCII`: bytes kept as they are, one character each.
    SqlAscii,
    /// `UTF8`.
    Utf8,
    /// Another, by index in [`OTHER`]; `u8::MAX` for a name pgfence does not know (two
    /// such may differ).
    Other(u8),
}

/// The other encodings Postgres knows.
const OTHER: [&str; 40] = [
    "LATIN1",
    "LATIN2",
    "LATIN3",
    "LATIN4",
    "LATIN5",
    "LATIN6",
    "LATIN7",
    "LATIN8",
    "LATIN9",
    "LATIN10",
    "ISO_8859_5",
    "ISO_8859_6",
    "ISO_8859_7",
    "ISO_8859_8",
    "WIN1250",
    "WIN1251",
    "WIN1252",
    "WIN1253",
    "WIN1254",
    "WIN1255",
    "WIN1256",
    "WIN1257",
    "WIN1258",
    "WIN866",
    "WIN874",
    "KOI8R",
    "KOI8U",
    "EUC_JP",
    "EUC_CN",
    "EUC_KR",
    "EUC_TW",
    "EUC_JIS_2004",
    "MULE_INTERNAL",
    "SJIS",
    "SHIFT_JIS_2004",
    "BIG5",
    "GBK",
    "UHC",
    "GB18030",
    "JOHAB",
];

impl Encoding {
    /// The encoding Postgres reports by this name.
    pub fn named(name: &[u8]) -> Self {
        let name = name.to_ascii_uppercase();
        match name.as_slice() {
            b"SQL_ASCII" => Self::SqlAscii,
            b"UTF8" | b"UNICODE" => Self::Utf8,
            _ => Self::Other(
                OTHER
                    .iter()
                    .position(|n| n.as_bytes() == name.as_slice())
                    .map_or(u8::MAX, |i| i as u8),
            ),
        }
    }

    /// Whether a name the client sends keeps its bytes in this (the server's) encoding.
    /// `client` is the client's encoding as last reported; `in_flight`: whether a request
    /// not yet answered may have changed it.
    fn keeps_bytes_of(self, client: Encoding, in_flight: impl FnOnce() -> bool) -> bool {
        self == Self::SqlAscii || (self == client && self != Self::Other(u8::MAX) && !in_flight())
    }
}

/// The key pgfence keeps a protocol statement or portal name under: Postgres' key as
/// a string, or [`UNCERTAIN`]. Keys of byte strings that are not UTF-8 are a NUL and
/// the bytes in hex, so two names Postgres tells apart never share a key.
pub fn protocol_key(name: &[u8], server: Encoding, client: Encoding, in_flight: impl FnOnce() -> bool) -> Cow<'_, str> {
    let cut = &name[..name.len().min(MAX_IDENT_BYTES)];
    if cut.is_ascii() || server.keeps_bytes_of(client, in_flight) {
        bytes_key(cut)
    } else {
        Cow::Borrowed(UNCERTAIN)
    }
}

/// Whether `key` is not the key of an ASCII name: a name that an [`UNCERTAIN`] one may be.
pub fn not_ascii(key: &str) -> bool {
    !key.is_ascii() || key.starts_with('\0')
}

/// `bytes` as a key: itself when it is UTF-8, else a NUL and its hex.
fn bytes_key(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => {
            let mut key = String::with_capacity(1 + 2 * bytes.len());
            key.push('\0');
            for b in bytes {
                let _ = write!(key, "{b:02x}");
            }
            Cow::Owned(key)
        }
    }
}

/// Whether pgfence may key an SQL identifier naming a statement or cursor differently
/// from Postgres. pgfence reads a text as UTF-8, decodes `U&"…"` escapes to UTF-8, folds
/// only ASCII letters and cuts on a character boundary of that reading: all as Postgres
/// does for a UTF8 client in a UTF8 database. Elsewhere Postgres writes an escape in the
/// database's encoding and folds other letters by the database's locale.
pub fn ident_uncertain(ident: &str, server: Encoding, client: Encoding, in_flight: bool) -> bool {
    let utf8 = server == Encoding::Utf8 && client == Encoding::Utf8 && !in_flight;
    !ident.is_ascii() && !utf8
}

#[cfg(test)]
mod tests {
    use super::*;

    const UTF8: Encoding = Encoding::Utf8;

    #[test]
    fn encodings_are_known_by_the_names_postgres_reports() {
        assert_eq!(Encoding::named(b"UTF8"), UTF8);
        assert_eq!(Encoding::named(b"sql_ascii"), Encoding::SqlAscii);
        assert_eq!(Encoding::named(b"win1252"), Encoding::named(b"WIN1252"));
        assert_ne!(Encoding::named(b"WIN1252"), Encoding::named(b"LATIN1"));
        assert_ne!(Encoding::named(b"EUC_JP"), Encoding::named(b"NEW_ONE"));
        assert_eq!(Encoding::named(b"NEW_ONE"), Encoding::Other(u8::MAX));
    }

    #[test]
    fn names_in_the_same_encoding_are_cut_at_63_bytes() {
        let base = "s".repeat(62);
        assert_eq!(protocol_key(b"s1", UTF8, UTF8, || false), "s1");
        assert_eq!(
            protocol_key(format!("{base}xyz").as_bytes(), UTF8, UTF8, || false),
            format!("{base}x")
        );
        // A cut inside a character keeps the bytes before it, as Postgres' key does.
        let acute = format!("{base}é");
        let e_acute = protocol_key(acute.as_bytes(), UTF8, UTF8, || false);
        assert_eq!(
            protocol_key(format!("{base}è").as_bytes(), UTF8, UTF8, || false),
            e_acute
        );
        assert_ne!(
            protocol_key(format!("{base}€").as_bytes(), UTF8, UTF8, || false),
            e_acute
        );
        assert_ne!(protocol_key(base.as_bytes(), UTF8, UTF8, || false), e_acute);
        // Bytes that are not UTF-8 (a LATIN1 client and database) are their own keys.
        let latin1 = Encoding::named(b"LATIN1");
        let (e, f) = (b"\xe9".repeat(70), [b"\xe9".repeat(63), b"x".to_vec()].concat());
        assert_eq!(
            protocol_key(&e, latin1, latin1, || false),
            protocol_key(&f, latin1, latin1, || false)
        );
        assert_ne!(
            protocol_key(&e, latin1, latin1, || false),
            protocol_key(b"\xe8", latin1, latin1, || false)
        );
        assert_ne!(
            protocol_key(b"\xe9", latin1, latin1, || false),
            protocol_key(b"\xe8", latin1, latin1, || false)
        );
    }

    #[test]
    fn names_pgfence_cannot_key_are_uncertain() {
        let (win1252, euc_jp) = (Encoding::named(b"WIN1252"), Encoding::named(b"EUC_JP"));
        // 'é' is two bytes to a UTF8 client, one in a WIN1252 database.
        assert_eq!(protocol_key("é".as_bytes(), win1252, UTF8, || false), UNCERTAIN);
        assert_eq!(protocol_key(&b"\xe9".repeat(40), UTF8, win1252, || false), UNCERTAIN);
        assert_eq!(protocol_key("é".as_bytes(), euc_jp, UTF8, || false), UNCERTAIN);
        // Kept bytes: a SQL_ASCII database, or the client's own encoding.
        assert_eq!(protocol_key("é".as_bytes(), Encoding::SqlAscii, UTF8, || false), "é");
        assert_eq!(protocol_key(b"\xe9", win1252, win1252, || false), "\0e9");
        // ASCII where it could be cut: the same key whatever the encodings.
        let ascii_head = "s".repeat(63) + "é";
        assert_eq!(
            protocol_key(ascii_head.as_bytes(), euc_jp, UTF8, || false),
            "s".repeat(63)
        );
        assert_eq!(protocol_key(b"s1", euc_jp, UTF8, || false), "s1");
        assert!(ident_uncertain("é", win1252, UTF8, false));
        assert!(!ident_uncertain(&"é".repeat(40), UTF8, UTF8, false));
        assert!(ident_uncertain("é", Encoding::SqlAscii, UTF8, false));
        assert!(!ident_uncertain(&"s".repeat(63), win1252, UTF8, false));
        // A request in flight may have changed client_encoding: only a SQL_ASCII database
        // keeps every name's bytes then.
        assert_eq!(protocol_key("é".as_bytes(), UTF8, UTF8, || true), UNCERTAIN);
        assert_eq!(protocol_key(b"s1", UTF8, UTF8, || true), "s1");
        assert_eq!(protocol_key("é".as_bytes(), Encoding::SqlAscii, UTF8, || true), "é");
        assert!(ident_uncertain("é", UTF8, UTF8, true));
    }
}
