//! A throwaway PostgreSQL cluster for integration tests, started from the installed server
//! binaries (there is no Docker engine here, and crates that download Postgres cannot reach the
//! network).
//!
//! One cluster serves the whole test binary ([`Cluster::shared`]); each test isolates itself with
//! [`Cluster::fresh_db`]. Tests that change global state (restart the server, replace
//! `pg_hba.conf`) start a private cluster with [`Cluster::start`] so they cannot break tests running
//! in parallel.
//!
//! Lifecycle. A `static` is never dropped and a test binary can be killed, so the postmaster is not
//! tied to a Rust destructor: it runs under a small `sh` watchdog ([`WATCHDOG`]) that polls the
//! test process and, once it is gone, stops the postmaster (SIGQUIT, Postgres' immediate shutdown)
//! and deletes the temp dir. The watchdog has its own process group, so a Ctrl-C aimed at
//! `cargo test` does not kill it before it has cleaned up. Private clusters are also stopped by
//! `Drop`.
//!
//! As root (CI), `initdb` and `postgres` refuse to run, so both run as the `postgres` user through
//! `runuser`, in a temp dir chowned to that user.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, Config, NoTls};

use super::{free_port, unique_temp_dir};

/// The superuser `initdb` creates; every cluster trusts it over the Unix socket.
pub const SUPERUSER: &str = "postgres";

/// How long a start (or a restart with crash recovery) may take before the test fails.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `"$@"` (the postmaster) and stops it when process `$1` (the test binary) has gone away,
/// then removes `$2` (the cluster's temp dir). Stopping on purpose (restart, `Drop`) is done by
/// signalling the postmaster; the watchdog then exits with it and leaves the directory alone.
const WATCHDOG: &str = r#"
parent=$1; root=$2; shift 2
"$@" &
child=$!
(
  while [ -d "/proc/$parent" ]; do sleep 0.2; done
  pid=$(head -n 1 "$root/data/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid" 2>/dev/null
) &
watcher=$!
wait "$child"; status=$?
kill "$watcher" 2>/dev/null
[ -d "/proc/$parent" ] || rm -rf "$root"
exit "$status"
"#;

/// Server settings. `fsync` and full-page writes are off for speed: a test cluster never has to
/// survive a power loss, and the OS page cache does survive a postmaster crash. `synchronous_commit`
/// stays on: with it off, a commit the client saw could still sit in WAL buffers when
/// [`Cluster::restart_immediate`] kills the server, and "nothing the client saw succeed is lost"
/// tests would fail for the wrong reason (seen here). Enough connections for concurrency tests
/// through a 1:1 proxy; prepared transactions for the `PREPARE TRANSACTION` clauses.
const SERVER_SETTINGS: &[&str] = &[
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "full_page_writes=off",
    "max_connections=300",
    "max_prepared_transactions=20",
];

/// A running throwaway cluster: data dir, Unix socket and server log live in one temp dir.
pub struct Cluster {
    bin_dir: PathBuf,
    root: PathBuf,
    port: u16,
    shared: bool,
    /// The watchdog `sh` whose child is the postmaster (directly, or via `runuser` as root);
    /// `None` only while a start is in progress.
    server: Mutex<Option<Child>>,
}

impl Cluster {
    /// The cluster shared by every test in this binary, started on first use.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        SHARED.get_or_init(|| Cluster::init(true))
    }

    /// A private cluster for one test, stopped and deleted when dropped. Use it for tests that
    /// restart the server or change `pg_hba.conf`.
    pub fn start() -> Cluster {
        Cluster::init(false)
    }

    /// The TCP port the server listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`, the form the proxy's `upstream` setting takes.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A program of the same installation as the server (`pgbench`, `psql`, `pg_dump`, …).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// The directory holding the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.root
    }

    /// Everything the server has logged so far; handy in assertion messages.
    pub fn server_log(&self) -> String {
        // Lossy: a test's non-UTF-8 names reach the log as the client sent them.
        String::from_utf8_lossy(&self.server_log_bytes()).into_owned()
    }

    /// The server log as bytes: offsets into it stay put as it grows.
    pub fn server_log_bytes(&self) -> Vec<u8> {
        fs::read(self.root.join("server.log")).unwrap_or_default()
    }

    /// A superuser connection over the Unix socket. It bypasses whatever TCP rules a test put in
    /// `pg_hba.conf` (see [`Cluster::set_hba_and_reload`]), and never goes through the proxy.
    pub async fn admin(&self, db: &str) -> Client {
        let mut config = Config::new();
        config.host_path(&self.root).port(self.port).user(SUPERUSER).dbname(db);
        connect_config(&config).await.unwrap_or_else(|e| {
            panic!(
                "admin connection to {db}: {e}\n--- server log ---\n{}",
                self.server_log()
            )
        })
    }

    /// Creates a database no other test uses and returns its name.
    pub async fn fresh_db(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!("it_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let admin = self.admin("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        name
    }

    /// Replaces `pg_hba.conf` with `lines` and waits until the server has reloaded it.
    ///
    /// A `local all postgres trust` line is always put first, so [`Cluster::admin`] and
    /// [`Cluster::fresh_db`] keep working whatever the test requires over TCP. The file is checked
    /// through `pg_hba_file_rules` first (Postgres keeps the old rules when the new file is bad,
    /// which would make an auth test pass for the wrong reason), and the reload is awaited by
    /// watching the server log, so the next connection sees the new rules.
    pub async fn set_hba_and_reload(&self, lines: &[&str]) {
        let mut text = format!("local all {SUPERUSER} trust\n");
        for line in lines {
            text.push_str(line);
            text.push('\n');
        }
        fs::write(self.data_dir().join("pg_hba.conf"), text).expect("write pg_hba.conf");

        let admin = self.admin("postgres").await;
        let errors = admin
            .query(
                "SELECT line_number, error FROM pg_hba_file_rules WHERE error IS NOT NULL",
                &[],
            )
            .await
            .expect("read pg_hba_file_rules");
        if !errors.is_empty() {
            let errors: Vec<String> = errors
                .iter()
                .map(|r| format!("line {:?}: {}", r.get::<_, Option<i32>>(0), r.get::<_, String>(1)))
                .collect();
            panic!("invalid pg_hba.conf lines {lines:?}: {errors:?}");
        }

        const RELOADED: &str = "received SIGHUP, reloading configuration files";
        let before = self.server_log().matches(RELOADED).count();
        admin
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("pg_reload_conf()");
        let deadline = Instant::now() + Duration::from_secs(10);
        // The postmaster logs this line before it reloads and accepts nothing in between, so a
        // connection made after the line appears sees the new rules.
        while self.server_log().matches(RELOADED).count() <= before {
            assert!(Instant::now() < deadline, "server did not reload its configuration");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the server the way a crash would (SIGQUIT: immediate shutdown, no checkpoint) and
    /// starts it again on the same port and data dir, waiting until it accepts connections (crash
    /// recovery included). Every open connection is cut.
    ///
    /// Blocks the calling thread for the duration; with a current-thread runtime, other tasks of
    /// the test make no progress meanwhile.
    ///
    /// # Panics
    /// On the shared cluster: a restart would cut the sessions of tests running in parallel.
    pub fn restart_immediate(&self) {
        assert!(
            !self.shared,
            "restart_immediate on the shared cluster would break other tests; use Cluster::start()"
        );
        let mut server = self.server.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut old) = server.take() {
            self.stop_immediate(&mut old);
        }
        *server = Some(self.start_server());
    }

    fn init(shared: bool) -> Cluster {
        let bin_dir = find_bin_dir();
        let root = unique_temp_dir("pgfence-pg");
        if running_as_root() {
            run(Command::new("chown").args([SUPERUSER, path_str(&root)]));
        }
        run(as_postgres(&bin_dir.join("initdb"))
            .args(["-D", path_str(&root.join("data"))])
            .args(["-A", "trust", "-U", SUPERUSER, "--no-sync", "-E", "UTF8", "--locale=C"])
            .current_dir(&root));

        let cluster = Cluster {
            bin_dir,
            root,
            port: free_port(),
            shared,
            server: Mutex::new(None),
        };
        *cluster.server.lock().unwrap() = Some(cluster.start_server());
        cluster
    }

    fn start_server(&self) -> Child {
        let mut server = self.spawn_server();
        self.wait_ready(&mut server);
        server
    }

    /// Starts the postmaster under the watchdog, output appended to `server.log`.
    fn spawn_server(&self) -> Child {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.root.join("server.log"))
            .expect("open server.log");
        let mut postgres = as_postgres(&self.bin_dir.join("postgres"));
        postgres.args([
            "-D",
            path_str(&self.data_dir()),
            "-p",
            &self.port.to_string(),
            "-k",
            path_str(&self.root),
        ]);
        for setting in SERVER_SETTINGS {
            postgres.args(["-c", setting]);
        }
        let mut watchdog = Command::new("sh");
        watchdog
            .args([
                "-c",
                WATCHDOG,
                "pgfence-pg-watchdog",
                &std::process::id().to_string(),
                path_str(&self.root),
            ])
            .arg(postgres.get_program())
            .args(postgres.get_args())
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup server.log"))
            .stderr(log)
            .process_group(0);
        watchdog.spawn().expect("spawn postgres watchdog")
    }

    /// Waits for a TCP connect and then `pg_isready`, failing fast (with the log) if the server
    /// exits instead.
    fn wait_ready(&self, server: &mut Child) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = server.try_wait() {
                panic!(
                    "postgres exited during startup ({status})\n--- server log ---\n{}",
                    self.server_log()
                );
            }
            let accepting = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_ok()
                && Command::new(self.bin("pg_isready"))
                    .args([
                        "-q",
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &self.port.to_string(),
                        "-U",
                        SUPERUSER,
                        "-d",
                        "postgres",
                    ])
                    .status()
                    .is_ok_and(|s| s.success());
            if accepting {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "postgres not ready after {READY_TIMEOUT:?}\n{}",
                self.server_log()
            );
            sleep(Duration::from_millis(50));
        }
    }

    /// SIGQUIT to the postmaster, then wait for the watchdog to follow it out.
    fn stop_immediate(&self, server: &mut Child) {
        if let Ok(pid) = fs::read_to_string(self.data_dir().join("postmaster.pid"))
            && let Some(pid) = pid.lines().next()
        {
            let _ = Command::new("kill").args(["-QUIT", pid]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = server.kill();
                let _ = server.wait();
                break;
            }
            sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            self.stop_immediate(&mut server);
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// A tokio-postgres config for `user postgres` at 127.0.0.1:`port`, database `db`; adjust it
/// (user, password, options, application_name …) and pass it to [`connect_config`].
pub fn config(port: u16, db: &str) -> Config {
    let mut config = Config::new();
    config.host("127.0.0.1").port(port).user(SUPERUSER).dbname(db);
    config
}

/// Connects as `postgres` over TCP (to Postgres or to a proxy in front of it) and spawns the
/// connection task. `options` is libpq's `options` startup parameter, e.g.
/// `"-c pgfence.epoch=3"`; pass `""` for none. Panics if the connection fails.
pub async fn connect(port: u16, db: &str, options: &str) -> Client {
    try_connect(port, db, options)
        .await
        .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}/{db}: {e}"))
}

/// Like [`connect`], but returns the error, for tests that expect the connection to be refused.
pub async fn try_connect(port: u16, db: &str, options: &str) -> Result<Client, tokio_postgres::Error> {
    let mut config = config(port, db);
    if !options.is_empty() {
        config.options(options);
    }
    connect_config(&config).await
}

/// Connects with `config` and spawns the connection task, which ends quietly when the server
/// closes the session (a test that provokes a FATAL wants to see it on the client, not here).
pub async fn connect_config(config: &Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// `$PG_BIN`, else the newest `/usr/lib/postgresql/<major>/bin` holding `initdb`.
fn find_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return PathBuf::from(dir);
    }
    let newest = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .max_by_key(|(major, _)| *major);
    match newest {
        Some((_, bin)) => bin,
        None => panic!("no PostgreSQL server binaries: set PG_BIN or run `make setup` (installs postgresql-15)"),
    }
}

fn running_as_root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// `program` as the `postgres` user when we are root (Postgres refuses to run as root), else as
/// ourselves.
fn as_postgres(program: &Path) -> Command {
    if running_as_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", SUPERUSER, "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// Runs a setup command to completion; its output is shown only when it fails.
fn run(cmd: &mut Command) {
    let output = match cmd.output() {
        Ok(output) => output,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!("{:?}: not found", cmd.get_program()),
        Err(e) => panic!("{cmd:?}: {e}"),
    };
    assert!(
        output.status.success(),
        "{cmd:?} failed ({})\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}
