//! The proxy run in-process on the test's own runtime: fast to start, and it
//! goes away with the test. Tests that need signals, exit codes or logs use
//! [`super::proxy::ProxyProcess`] instead.

use std::net::SocketAddr;
use std::sync::Arc;

use pgfence::config::RawConfig;
use pgfence::server::{Server, Shutdown};

/// A running in-process proxy.
pub struct Proxy {
    addr: SocketAddr,
    /// Tokens to stop it.
    pub shutdown: Shutdown,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy in front of `upstream_port` with extra TOML (e.g. `[[fence]]` sections).
    pub async fn start(upstream_port: u16, extra_toml: &str) -> Proxy {
        let toml = format!("listen = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:{upstream_port}\"\n{extra_toml}");
        let config = RawConfig::from_toml(&toml)
            .expect("toml")
            .validate()
            .expect("valid config");
        Self::start_with(config).await
    }

    /// Starts a proxy with a validated config (its `listen` should use port 0).
    pub async fn start_with(config: pgfence::config::Config) -> Proxy {
        let server = Server::bind(Arc::new(config)).await.expect("bind");
        let addr = server.local_addr().expect("addr");
        let shutdown = Shutdown::default();
        let task = tokio::spawn(server.run(shutdown.clone()));
        Proxy { addr, shutdown, task }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the server task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.fast.cancel();
    }
}
