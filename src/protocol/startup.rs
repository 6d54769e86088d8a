//! The startup phase: the first packet a client sends has no type byte, only a
//! length and a code (SSLRequest, GSSENCRequest, CancelRequest, or a protocol
//! version followed by parameters).
//!
//! See <https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-START-UP>.

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::MAX_STARTUP_PACKET;
use super::frame::Body;

/// The code of an SSLRequest.
pub const SSL_REQUEST: u32 = 80_877_103;
/// The code of a GSSENCRequest.
pub const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;
const PROTOCOL_MAJOR_3: u32 = 3;

/// The first packet of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstPacket {
    /// Asks for TLS; answered 'N' until TLS is configured.
    SslRequest,
    /// Asks for GSSAPI encryption; answered 'N'.
    GssEncRequest,
    /// Cancels a query running on another connection.
    Cancel {
        /// Process id from BackendKeyData.
        pid: i32,
        /// Secret key from BackendKeyData.
        secret: i32,
    },
    /// A StartupMessage.
    Startup(StartupMessage),
}

/// A parsed StartupMessage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupMessage {
    /// Minor protocol version the client asked for (major is always 3).
    pub minor: u16,
    /// Parameters in the order sent, `_pq_.` protocol options included. Bytes that are
    /// not UTF-8 read as U+FFFD here (so they match no name or value pgfence looks for);
    /// Postgres gets them as sent (`verbatim`).
    pub params: Vec<(String, String)>,
    /// `params` as sent.
    verbatim: Vec<RawParam>,
}

/// A startup parameter's name and value as sent.
type RawParam = (Vec<u8>, Vec<u8>);

/// Why the first packet was refused.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// I/O error or EOF before a whole packet.
    #[error("connection closed during startup")]
    Io(#[from] std::io::Error),
    /// Length outside 8..=10004 (length word included).
    #[error("invalid length of startup packet")]
    BadLength,
    /// Protocol major version other than 3.
    #[error("unsupported frontend protocol {0}.{1}: server supports 3.0 to 3.0")]
    UnsupportedProtocol(u32, u32),
    /// Parameters not NUL-terminated pairs.
    #[error("invalid startup packet layout")]
    Malformed,
    /// Bytes that had come after an encryption request before its answer: the client sent
    /// them without waiting for it. Postgres refuses them (they were not encrypted, and may
    /// have been put there by someone in between).
    #[error("received unencrypted data after {0}")]
    UnencryptedAfter(&'static str),
    /// A message during authentication longer than any such message can be.
    #[error("invalid length of authentication message")]
    BadAuthLength,
    /// The upstream server broke off or broke the protocol during startup: not the
    /// client's fault, so it is told the server could not be reached.
    #[error("{0}")]
    Upstream(String),
}

impl StartupError {
    /// This error, met on the upstream side of the startup.
    pub fn upstream(self) -> StartupError {
        match self {
            StartupError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                StartupError::Upstream("the server closed the connection during startup".into())
            }
            StartupError::Io(e) => StartupError::Upstream(format!("the connection failed during startup: {e}")),
            StartupError::Upstream(reason) => StartupError::Upstream(reason),
            _ => StartupError::Upstream("the server sent an invalid message during startup".into()),
        }
    }
}

/// Reads one startup-phase packet. Cancel safe: no (it reads in several steps).
pub async fn read_first_packet<R: AsyncRead + Unpin>(r: &mut R) -> Result<FirstPacket, StartupError> {
    let len = r.read_u32().await? as usize;
    // Postgres limits the packet without its length word.
    if !(8..=MAX_STARTUP_PACKET + 4).contains(&len) {
        return Err(StartupError::BadLength);
    }
    let mut body = vec![0; len - 4];
    r.read_exact(&mut body).await?;
    parse_first_packet(&body)
}

/// Parses a startup-phase packet body (after the length).
pub fn parse_first_packet(body: &[u8]) -> Result<FirstPacket, StartupError> {
    let mut b = Body::new(body);
    let code = b.i32().ok_or(StartupError::BadLength)? as u32;
    match code {
        SSL_REQUEST => Ok(FirstPacket::SslRequest),
        GSSENC_REQUEST => Ok(FirstPacket::GssEncRequest),
        CANCEL_REQUEST => {
            let pid = b.i32().ok_or(StartupError::Malformed)?;
            let secret = b.i32().ok_or(StartupError::Malformed)?;
            // Protocol 3.0's key is these 8 bytes; Postgres 15 refuses a packet of any other
            // length rather than match part of it.
            if !b.rest().is_empty() {
                return Err(StartupError::Malformed);
            }
            Ok(FirstPacket::Cancel { pid, secret })
        }
        version => {
            let (major, minor) = (version >> 16, version & 0xffff);
            if major != PROTOCOL_MAJOR_3 {
                return Err(StartupError::UnsupportedProtocol(major, minor));
            }
            let verbatim = parse_params(b)?;
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            Ok(FirstPacket::Startup(StartupMessage {
                minor: minor as u16,
                params: verbatim.iter().map(|(k, v)| (text(k), text(v))).collect(),
                verbatim,
            }))
        }
    }
}

/// Parameters as Postgres reads them: NUL-terminated pairs of bytes, in whatever encoding the
/// client uses (Postgres only checks them against its own names and settings).
fn parse_params(mut b: Body<'_>) -> Result<Vec<RawParam>, StartupError> {
    let mut params = Vec::new();
    loop {
        let key = b.cstr().ok_or(StartupError::Malformed)?;
        if key.is_empty() {
            break;
        }
        let value = b.cstr().ok_or(StartupError::Malformed)?;
        params.push((key.to_owned(), value.to_owned()));
    }
    if !b.rest().is_empty() {
        return Err(StartupError::Malformed);
    }
    Ok(params)
}

impl StartupMessage {
    /// A StartupMessage of protocol 3.`minor` with these parameters.
    pub fn new(minor: u16, params: Vec<(String, String)>) -> Self {
        let verbatim = params
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        Self {
            minor,
            params,
            verbatim,
        }
    }

    /// The value of a parameter: the last one given, as Postgres reads a repeated key.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `_pq_.` protocol options pgfence does not support (it supports none).
    pub fn protocol_options(&self) -> Vec<String> {
        self.params
            .iter()
            .filter(|(k, _)| k.starts_with("_pq_."))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The packet pgfence sends upstream: protocol 3.0, without `_pq_.` options
    /// (pgfence has already answered those with NegotiateProtocolVersion).
    pub fn encode_for_upstream(&self) -> BytesMut {
        let mut body = BytesMut::new();
        body.put_u32(PROTOCOL_MAJOR_3 << 16);
        for (k, v) in self.verbatim.iter().filter(|(k, _)| !k.starts_with(b"_pq_.")) {
            body.put_slice(k);
            body.put_u8(0);
            body.put_slice(v);
            body.put_u8(0);
        }
        body.put_u8(0);
        let mut out = BytesMut::with_capacity(body.len() + 4);
        out.put_u32((body.len() + 4) as u32);
        out.put_slice(&body);
        out
    }

    /// Settings given with `-c name=value` or `--name=value` in the `options`
    /// parameter, split the way Postgres splits them (whitespace separates,
    /// a backslash escapes the next character) and read as its `getopt` reads its
    /// switches: flags may share a word (`-ec name=value`), and a switch that takes a
    /// value takes the rest of its word or else the next word, whatever it looks like
    /// (`-C --name=value` sets nothing). `--` alone ends the switches. Words Postgres
    /// would refuse (an unknown switch, a stray argument) fail its startup anyway.
    pub fn option_settings(&self) -> Vec<(String, String)> {
        let Some(options) = self.get("options") else {
            return Vec::new();
        };
        let words = split_options(options);
        let mut out = Vec::new();
        let mut words = words.iter();
        while let Some(w) = words.next() {
            if w == "--" {
                break;
            }
            let Some(flags) = w.strip_prefix('-').filter(|f| !f.is_empty()) else {
                continue;
            };
            for (i, c) in flags.char_indices() {
                if FLAG_SWITCHES.contains(c) {
                    continue;
                }
                if VALUE_SWITCHES.contains(c) {
                    let rest = &flags[i + c.len_utf8()..];
                    let value = if rest.is_empty() {
                        words.next().map(String::as_str)
                    } else {
                        Some(rest)
                    };
                    if matches!(c, 'c' | '-')
                        && let Some((k, v)) = value.and_then(|v| v.split_once('='))
                    {
                        // Postgres treats '-' in option names as '_'.
                        out.push((k.replace('-', "_"), v.to_owned()));
                    }
                }
                // A switch with a value ends the word; an unknown one fails Postgres' startup.
                break;
            }
        }
        out
    }
}

/// Postgres' backend switches without a value (`getopt`'s option string, PostgreSQL 15).
const FLAG_SWITCHES: &str = "bEeFijlnOPsT";
/// Its switches that take a value.
const VALUE_SWITCHES: &str = "BCcDdfhkNprStvW-";

fn split_options(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            // C's `isspace`, as Postgres splits: Rust's ASCII whitespace and the vertical tab.
            c if c.is_ascii_whitespace() || c == '\x0B' => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn startup(params: &[(&str, &str)]) -> Vec<u8> {
        let m = StartupMessage::new(0, params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        m.encode_for_upstream()[4..].to_vec()
    }

    /// A startup packet of `total` bytes, length word included.
    fn packet_of(total: usize) -> Vec<u8> {
        let mut body = startup(&[("user", "u"), ("database", "d"), ("application_name", "")]);
        body.pop(); // the terminating NUL
        body.pop(); // the empty value's NUL
        body.resize(total - 4 - 2, b'a');
        body.extend_from_slice(b"\0\0");
        let mut p = (total as u32).to_be_bytes().to_vec();
        p.extend_from_slice(&body);
        p
    }

    #[tokio::test]
    async fn startup_packets_up_to_10004_bytes_are_read_as_postgres_reads_them() {
        let FirstPacket::Startup(m) = read_first_packet(&mut packet_of(10_004).as_slice()).await.unwrap() else {
            panic!("not a startup packet")
        };
        // Less the length word, the version and the two other parameters, and two NULs.
        assert_eq!(m.get("application_name").map(str::len), Some(10_004 - 4 - 39 - 2));
        let err = read_first_packet(&mut packet_of(10_005).as_slice()).await.unwrap_err();
        assert!(matches!(err, StartupError::BadLength), "{err:?}");
    }

    #[test]
    fn startup_round_trips() {
        let body = startup(&[("user", "u"), ("database", "d")]);
        let FirstPacket::Startup(m) = parse_first_packet(&body).unwrap() else {
            panic!()
        };
        assert_eq!(m.get("user"), Some("u"));
        assert_eq!(m.get("database"), Some("d"));
    }

    #[test]
    fn a_repeated_parameter_reads_as_its_last_value() {
        let body = startup(&[
            ("database", "first"),
            ("options", "-c pgfence.epoch=3"),
            ("database", "last"),
            ("options", "-c pgfence.epoch=2"),
        ]);
        let FirstPacket::Startup(m) = parse_first_packet(&body).unwrap() else {
            panic!()
        };
        assert_eq!(m.get("database"), Some("last"));
        assert_eq!(m.option_settings(), [("pgfence.epoch".to_owned(), "2".to_owned())]);
    }

    /// Postgres splits `options` where C's `isspace` is true, the vertical tab included.
    #[test]
    fn options_split_at_every_space_postgres_splits_at() {
        for space in [" ", "\t", "\n", "\x0B", "\x0C", "\r"] {
            let m = StartupMessage::new(0, vec![("options".into(), format!("-c{space}pgfence.epoch=5"))]);
            assert_eq!(
                m.option_settings(),
                [("pgfence.epoch".to_owned(), "5".to_owned())],
                "{space:?}"
            );
        }
    }

    #[test]
    fn special_requests_are_recognised() {
        assert_eq!(
            parse_first_packet(&SSL_REQUEST.to_be_bytes()).unwrap(),
            FirstPacket::SslRequest
        );
        assert_eq!(
            parse_first_packet(&GSSENC_REQUEST.to_be_bytes()).unwrap(),
            FirstPacket::GssEncRequest
        );
        let mut cancel = CANCEL_REQUEST.to_be_bytes().to_vec();
        cancel.extend(7i32.to_be_bytes());
        cancel.extend((-9i32).to_be_bytes());
        assert_eq!(
            parse_first_packet(&cancel).unwrap(),
            FirstPacket::Cancel { pid: 7, secret: -9 }
        );
        // A longer key is not matched by its first bytes.
        cancel.extend(1i32.to_be_bytes());
        assert!(matches!(parse_first_packet(&cancel), Err(StartupError::Malformed)));
    }

    #[test]
    fn malformed_startups_are_refused() {
        let mut v2 = (2u32 << 16).to_be_bytes().to_vec();
        v2.push(0);
        assert!(matches!(
            parse_first_packet(&v2),
            Err(StartupError::UnsupportedProtocol(2, 0))
        ));
        let mut unterminated = (3u32 << 16).to_be_bytes().to_vec();
        unterminated.extend(b"user\0bob");
        assert!(matches!(
            parse_first_packet(&unterminated),
            Err(StartupError::Malformed)
        ));
        assert!(parse_first_packet(&[1, 2]).is_err());
    }

    #[test]
    fn options_are_split_like_postgres() {
        let body = startup(&[("options", "-c pgfence.epoch=7 --search-path=a\\ b -cwork_mem=1MB")]);
        let FirstPacket::Startup(m) = parse_first_packet(&body).unwrap() else {
            panic!()
        };
        assert_eq!(
            m.option_settings(),
            vec![
                ("pgfence.epoch".to_string(), "7".to_string()),
                ("search_path".to_string(), "a b".to_string()),
                ("work_mem".to_string(), "1MB".to_string()),
            ]
        );
    }

    #[test]
    fn options_are_read_as_postgres_getopt_reads_them() {
        let settings = |options: &str| {
            let FirstPacket::Startup(m) = parse_first_packet(&startup(&[("options", options)])).unwrap() else {
                panic!()
            };
            m.option_settings()
        };
        let epoch = |v: &str| vec![("pgfence.epoch".to_string(), v.to_string())];
        // A switch that takes a value takes the next word, whatever it looks like.
        assert_eq!(settings("-c pgfence.epoch=1 -C --pgfence.epoch=9"), epoch("1"));
        assert_eq!(settings("-c pgfence.epoch=1 -r -cpgfence.epoch=9"), epoch("1"));
        // (the stray word left after `-D -c` fails the startup in Postgres)
        assert_eq!(settings("-c pgfence.epoch=1 -D -c pgfence.epoch=9"), epoch("1"));
        // Flags share a word with a switch after them.
        assert_eq!(settings("-ec pgfence.epoch=3"), epoch("3"));
        assert_eq!(settings("-Fecpgfence.epoch=4"), epoch("4"));
        // A value switch ends its word: `-Cc` asks for the value of a setting named "c".
        assert_eq!(settings("-Cc pgfence.epoch=5"), vec![]);
        // `--` ends the switches; stray words are skipped (Postgres refuses them anyway).
        assert_eq!(settings("-c pgfence.epoch=1 -- -c pgfence.epoch=9"), epoch("1"));
        assert_eq!(settings("stray -c pgfence.epoch=6"), epoch("6"));
    }
}
