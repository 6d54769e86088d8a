//! A minimal raw wire-protocol client for what drivers never send: arbitrary
//! startup parameters, malformed messages, hand-made pipelines.

use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One backend message: type byte and body.
#[derive(Debug, Clone)]
pub struct Msg {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl Msg {
    /// The `C` field of an ErrorResponse.
    pub fn code(&self) -> Option<String> {
        self.field(b'C')
    }

    /// A field of an ErrorResponse/NoticeResponse.
    pub fn field(&self, which: u8) -> Option<String> {
        if self.tag != b'E' && self.tag != b'N' {
            return None;
        }
        let mut rest = &self.body[..];
        while let Some((&f, tail)) = rest.split_first() {
            if f == 0 {
                break;
            }
            let end = tail.iter().position(|&b| b == 0)?;
            if f == which {
                return Some(String::from_utf8_lossy(&tail[..end]).into_owned());
            }
            rest = &tail[end + 1..];
        }
        None
    }
}

/// A raw connection.
pub struct Raw {
    pub stream: TcpStream,
    buf: BytesMut,
    /// The last read gave up after its 10 s wait, with the connection still open.
    timed_out: bool,
}

/// A startup packet body with these parameters (protocol 3.0).
pub fn startup_packet(params: &[(&str, &str)]) -> Vec<u8> {
    let params: Vec<(&[u8], &[u8])> = params.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())).collect();
    startup_packet_bytes(&params)
}

/// A startup packet body with these parameters as bytes, in any encoding (protocol 3.0).
pub fn startup_packet_bytes(params: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut body = BytesMut::new();
    body.put_u32(3 << 16);
    for (k, v) in params {
        body.put_slice(k);
        body.put_u8(0);
        body.put_slice(v);
        body.put_u8(0);
    }
    body.put_u8(0);
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A frontend message.
pub fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A simple Query message.
pub fn query(sql: &str) -> Vec<u8> {
    let mut body = sql.as_bytes().to_vec();
    body.push(0);
    message(b'Q', &body)
}

/// Parse of `sql` as statement `name`, no parameter types.
pub fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut b = Vec::new();
    for s in [name, sql] {
        b.extend(s.as_bytes());
        b.push(0);
    }
    b.extend(0u16.to_be_bytes());
    message(b'P', &b)
}

/// Bind with text parameters and text results.
pub fn bind(portal: &str, statement: &str, params: &[&str]) -> Vec<u8> {
    let mut b = Vec::new();
    for s in [portal, statement] {
        b.extend(s.as_bytes());
        b.push(0);
    }
    b.extend(0u16.to_be_bytes());
    b.extend((params.len() as u16).to_be_bytes());
    for p in params {
        b.extend((p.len() as i32).to_be_bytes());
        b.extend(p.as_bytes());
    }
    b.extend(0u16.to_be_bytes());
    message(b'B', &b)
}

/// Execute of `portal`, all rows.
pub fn execute(portal: &str) -> Vec<u8> {
    let mut b = portal.as_bytes().to_vec();
    b.push(0);
    b.extend(0i32.to_be_bytes());
    message(b'E', &b)
}

/// Close of prepared statement `name`.
pub fn close_statement(name: &str) -> Vec<u8> {
    let mut b = vec![b'S'];
    b.extend(name.as_bytes());
    b.push(0);
    message(b'C', &b)
}

/// Describe of prepared statement `name`.
pub fn describe_statement(name: &str) -> Vec<u8> {
    let mut b = vec![b'S'];
    b.extend(name.as_bytes());
    b.push(0);
    message(b'D', &b)
}

/// Sync.
pub fn sync() -> Vec<u8> {
    message(b'S', b"")
}

impl Raw {
    /// Connects without sending anything.
    pub async fn connect(port: u16) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        Raw {
            stream,
            buf: BytesMut::new(),
            timed_out: false,
        }
    }

    /// Connects and completes a trust-auth startup with these parameters;
    /// returns every message up to and including the first ReadyForQuery or ErrorResponse.
    pub async fn startup(port: u16, params: &[(&str, &str)]) -> (Raw, Vec<Msg>) {
        let mut raw = Self::connect(port).await;
        raw.send(&startup_packet(params)).await;
        let msgs = raw.read_until(|m| m.tag == b'Z' || m.tag == b'E').await;
        (raw, msgs)
    }

    /// Writes bytes.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Reads one message, or None on EOF / reset / 10 s timeout.
    pub async fn read(&mut self) -> Option<Msg> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if self.buf.len() > len {
                    let tag = self.buf[0];
                    self.buf.advance(5);
                    let body = self.buf.split_to(len - 4).to_vec();
                    return Some(Msg { tag, body });
                }
            }
            match tokio::time::timeout(Duration::from_secs(10), self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return None,
                Err(_) => {
                    self.timed_out = true;
                    return None;
                }
            }
        }
    }

    /// Reads messages until `stop` matches one (included) or the connection ends.
    pub async fn read_until(&mut self, stop: impl Fn(&Msg) -> bool) -> Vec<Msg> {
        let mut out = Vec::new();
        while let Some(m) = self.read().await {
            let done = stop(&m);
            out.push(m);
            if done {
                break;
            }
        }
        out
    }

    /// Sends a simple query and reads up to ReadyForQuery.
    pub async fn simple(&mut self, sql: &str) -> Vec<Msg> {
        self.send(&query(sql)).await;
        self.read_until(|m| m.tag == b'Z').await
    }

    /// Whether the server closed the connection (EOF or reset, with no 10 s silence before
    /// it), ignoring remaining messages.
    pub async fn closed(&mut self) -> bool {
        while self.read().await.is_some() {}
        !self.timed_out
    }
}

/// The error codes among `msgs`.
pub fn codes(msgs: &[Msg]) -> Vec<String> {
    msgs.iter().filter_map(Msg::code).collect()
}

/// The message types of `msgs` as a string, e.g. "TDCZ".
pub fn tags(msgs: &[Msg]) -> String {
    msgs.iter().map(|m| m.tag as char).collect()
}

/// The first column of the first row among `msgs`, as text (`SHOW` answers one).
pub fn first_value(msgs: &[Msg]) -> Option<String> {
    // A DataRow: the column count (2 bytes), the first column's length (4), its bytes.
    let row = msgs.iter().find(|m| m.tag == b'D')?;
    Some(String::from_utf8_lossy(row.body.get(6..)?).into_owned())
}
