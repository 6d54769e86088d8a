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

/// A map keyed by statement or portal name. The unnamed statement and portal (the empty
/// name), which extended-protocol clients use for nearly every query, live beside the
/// table: they take no hashing, and no comparison of empty strings, which glibc's
/// AVX-512 `memcmp` makes with a masked load from the dangling pointer of an empty
/// `String` (a fault-suppressing load that costs tens of nanoseconds on some CPUs).
#[derive(Debug, Clone)]
pub struct NameMap<V> {
    unnamed: Option<V>,
    named: std::collections::HashMap<String, V>,
}

impl<V> Default for NameMap<V> {
    fn default() -> Self {
        Self {
            unnamed: None,
            named: std::collections::HashMap::new(),
        }
    }
}

impl<V> NameMap<V> {
    pub fn get(&self, name: &str) -> Option<&V> {
        if name.is_empty() {
            self.unnamed.as_ref()
        } else {
            self.named.get(name)
        }
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut V> {
        if name.is_empty() {
            self.unnamed.as_mut()
        } else {
            self.named.get_mut(name)
        }
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Sets `name` to `value`; returns what it held.
    pub fn insert(&mut self, name: &str, value: V) -> Option<V> {
        if name.is_empty() {
            self.unnamed.replace(value)
        } else {
            self.named.insert(name.to_owned(), value)
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<V> {
        if name.is_empty() {
            self.unnamed.take()
        } else {
            self.named.remove(name)
        }
    }

    /// What `name` holds, a default value put there first if nothing.
    pub fn get_or_default(&mut self, name: &str) -> &mut V
    where
        V: Default,
    {
        if name.is_empty() {
            self.unnamed.get_or_insert_with(V::default)
        } else {
            self.named.entry(name.to_owned()).or_default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.unnamed.is_none() && self.named.is_empty()
    }

    pub fn clear(&mut self) {
        self.unnamed = None;
        self.named.clear();
    }

    /// Its entries, the unnamed one first.
    pub fn into_entries(self) -> impl Iterator<Item = (String, V)> {
        let unnamed = self.unnamed.map(|v| (String::new(), v));
        unnamed.into_iter().chain(self.named)
    }

    /// Keeps the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &mut V) -> bool) {
        if self.unnamed.as_mut().is_some_and(|v| !keep("", v)) {
            self.unnamed = None;
        }
        self.named.retain(|k, v| keep(k, v));
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        let unnamed = self.unnamed.as_ref().map(|v| ("", v));
        unnamed
            .into_iter()
            .chain(self.named.iter().map(|(k, v)| (k.as_str(), v)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        let unnamed = self.unnamed.as_mut().map(|v| ("", v));
        unnamed
            .into_iter()
            .chain(self.named.iter_mut().map(|(k, v)| (k.as_str(), v)))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
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

    /// The unnamed entry is one like the others: found, replaced, kept or dropped by
    /// `retain`, listed by `iter`, and not confused with a named one.
    #[test]
    fn a_name_map_keeps_the_unnamed_entry_beside_the_others() {
        let mut m = NameMap::default();
        assert!(m.is_empty());
        assert_eq!(m.insert("", 1), None);
        assert_eq!(m.insert("a", 2), None);
        assert_eq!(m.insert("", 3), Some(1));
        assert_eq!((m.get(""), m.get("a"), m.get("b")), (Some(&3), Some(&2), None));
        *m.get_or_default("") += 10;
        *m.get_or_default("b") += 5;
        let mut all: Vec<(&str, i32)> = m.iter().map(|(k, v)| (k, *v)).collect();
        all.sort();
        assert_eq!(all, [("", 13), ("a", 2), ("b", 5)]);
        m.retain(|k, v| !k.is_empty() && *v > 2);
        assert_eq!(
            (m.contains_key(""), m.contains_key("a"), m.contains_key("b")),
            (false, false, true)
        );
        assert_eq!(m.remove("b"), Some(5));
        m.insert("", 1);
        m.clear();
        assert!(m.is_empty());
    }
}
