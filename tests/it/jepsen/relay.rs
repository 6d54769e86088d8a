//! A TCP relay between writers and one endpoint that the nemesis can stall: while a stall is on,
//! bytes already read are held back in both directions, like a congested or partitioned link
//! (the connection stays open; messages arrive late, not lost).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

/// Until when traffic is held; `None` or a past instant: flowing.
type Stall = Arc<Mutex<Option<Instant>>>;

/// A running relay on 127.0.0.1; stops accepting when dropped (open connections end with
/// their peers).
pub struct Relay {
    port: u16,
    stall: Stall,
    task: JoinHandle<()>,
}

impl Relay {
    /// Relays every connection made to the returned relay's port to 127.0.0.1:`target`.
    pub async fn start(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let port = listener.local_addr().expect("relay addr").port();
        let stall = Stall::default();
        let task = tokio::spawn(accept(listener, target, stall.clone()));
        Relay { port, stall, task }
    }

    /// The port writers connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Holds all traffic for `duration` from now.
    pub fn stall(&self, duration: Duration) {
        *self.stall.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + duration);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, target: u16, stall: Stall) {
    while let Ok((client, _)) = listener.accept().await {
        let stall = stall.clone();
        tokio::spawn(async move {
            // The endpoint may be down (a killed proxy): the writer sees the connection close.
            let Ok(upstream) = TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            let (cr, cw) = client.into_split();
            let (ur, uw) = upstream.into_split();
            tokio::join!(pump(cr, uw, stall.clone()), pump(ur, cw, stall));
        });
    }
}

/// Copies `from` to `to`, waiting out stalls between reads and writes.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, stall: Stall) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        loop {
            let until = *stall.lock().unwrap_or_else(|e| e.into_inner());
            match until {
                Some(until) if until > Instant::now() => sleep_until(until).await,
                _ => break,
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
