//! The `pgfence` binary run as a subprocess, for tests of what only a real process shows: signal
//! handling (SIGTERM drains, SIGINT exits fast), exit codes, config errors and log output.
//!
//! Each proxy gets its own temp dir holding the config file and `proxy.log` (stdout and stderr).
//! The process is killed and the dir removed on drop; if the test is panicking, the log is printed
//! first, because it is usually the explanation.

use std::fs::{self, File};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, unique_temp_dir};

/// How long the proxy may take to accept TCP connections after it was spawned.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A config for a proxy listening on 127.0.0.1:`listen_port` in front of 127.0.0.1:`upstream_port`,
/// followed by `extra` (e.g. `[[fence]]` sections), verbatim.
pub fn proxy_toml(listen_port: u16, upstream_port: u16, extra: &str) -> String {
    format!("listen = \"127.0.0.1:{listen_port}\"\nupstream = \"127.0.0.1:{upstream_port}\"\n\n{extra}\n")
}

/// A running `pgfence serve` process.
pub struct ProxyProcess {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    exit: Option<ExitStatus>,
}

impl ProxyProcess {
    /// Starts a proxy on a free port in front of 127.0.0.1:`upstream_port`; `extra` is appended to
    /// the config (fence sections, other settings).
    pub fn start_for(upstream_port: u16, extra: &str) -> ProxyProcess {
        ProxyProcess::start(&proxy_toml(free_port(), upstream_port, extra))
    }

    /// Writes `config_toml` to a file and runs `pgfence serve --config FILE` with `RUST_LOG=info`
    /// (or the caller's `RUST_LOG`), returning once the listen address accepts TCP.
    ///
    /// # Panics
    /// If the config has no `listen = "host:port"` line, or the proxy exits or does not listen
    /// within [`START_TIMEOUT`] (the panic message carries its log).
    pub fn start(config_toml: &str) -> ProxyProcess {
        Self::start_under(config_toml, None)
    }

    /// [`Self::start`] from a shell that first runs `prelude`: limits (`ulimit -S -n 100`)
    /// or redirections (`exec 2>/dev/full`) the proxy then runs under.
    pub fn start_after(config_toml: &str, prelude: &str) -> ProxyProcess {
        Self::start_under(config_toml, Some(prelude))
    }

    fn start_under(config_toml: &str, prelude: Option<&str>) -> ProxyProcess {
        let addr = listen_addr(config_toml);
        let dir = unique_temp_dir("pgfence-proxy");
        let config = dir.join("pgfence.toml");
        fs::write(&config, config_toml).expect("write proxy config");
        let log = File::create(dir.join("proxy.log")).expect("create proxy.log");
        let bin = env!("CARGO_BIN_EXE_pgfence");
        let mut command = match prelude {
            None => Command::new(bin),
            Some(prelude) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", &format!("{prelude} && exec \"$0\" \"$@\""), bin]);
                sh
            }
        };
        let child = command
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup proxy.log"))
            .stderr(log)
            .spawn()
            .expect("spawn pgfence");
        let mut proxy = ProxyProcess {
            child,
            addr,
            dir,
            exit: None,
        };
        proxy.wait_listening();
        proxy
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The process id, e.g. to read `/proc/PID/status`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The config file the proxy was started with.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("pgfence.toml")
    }

    /// Asks the proxy to drain and exit.
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Asks the proxy to exit fast.
    pub fn sigint(&self) {
        self.signal("INT");
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    ///
    /// Async so that the test's client tasks (e.g. a session finishing its transaction during a
    /// drain) keep running on a current-thread runtime while we wait.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The exit status if the process has exited, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait pgfence");
        }
        self.exit
    }

    /// Everything the proxy has written to stdout and stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("proxy.log")).unwrap_or_default()
    }

    pub fn signal(&self, name: &str) {
        // `kill(1)` rather than the libc crate: one process spawn is nothing next to a test.
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "kill -{name} {} failed",
            self.child.id()
        );
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.try_wait() {
                panic!(
                    "pgfence exited during startup ({status})\n--- proxy log ---\n{}",
                    self.log()
                );
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pgfence not listening on {} after {START_TIMEOUT:?}\n--- proxy log ---\n{}",
                self.addr,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- pgfence log ({}) ---\n{}", self.addr, self.log());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The `listen = "host:port"` value of a config, so we know where to wait for the proxy.
fn listen_addr(config_toml: &str) -> SocketAddr {
    let value = config_toml.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "listen").then(|| value.trim().trim_matches('"').to_string())
    });
    let value =
        value.unwrap_or_else(|| panic!("proxy config needs a listen = \"127.0.0.1:PORT\" line:\n{config_toml}"));
    value.parse().unwrap_or_else(|e| panic!("listen = {value:?}: {e}"))
}
