//! A throwaway Postgres for the demo, started from the installed server binaries: `initdb` and
//! `postgres` in a temp dir, on a free 127.0.0.1 port, stopped and deleted when dropped.
//!
//! As root, `initdb` and `postgres` refuse to run, so both run as the `postgres` user through
//! `runuser`, in a temp dir chowned to that user. The postmaster runs under a small `sh` watchdog
//! in its own process group: a Ctrl-C at the terminal reaches only the demo, which then stops the
//! server itself; and if the demo is killed outright, the watchdog stops the server and removes the
//! directory.

use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use tokio_postgres::{Client, Config, NoTls};

/// The superuser `initdb` creates, trusted on 127.0.0.1 and the Unix socket.
pub const SUPERUSER: &str = "postgres";

/// How long the server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stop may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `"$@"` (the postmaster); once process `$1` (the demo) is gone, stops it and removes `$2`.
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

/// A running throwaway cluster.
pub struct Cluster {
    bin_dir: PathBuf,
    root: PathBuf,
    port: u16,
    server: Option<Child>,
}

/// `$PG_BIN`, else the newest `/usr/lib/postgresql/<major>/bin` holding `initdb`.
pub fn find_bin_dir() -> anyhow::Result<PathBuf> {
    const HOW: &str = "install them (`apt-get install postgresql`) or set PG_BIN to their directory, \
                       e.g. PG_BIN=/usr/lib/postgresql/15/bin";
    if let Some(dir) = std::env::var_os("PG_BIN") {
        let dir = PathBuf::from(dir);
        if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
            return Ok(dir);
        }
        bail!("PG_BIN={} has no initdb and postgres: {HOW}", dir.display());
    }
    fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").is_file() && bin.join("postgres").is_file())
        .max_by_key(|(major, _)| *major)
        .map(|(_, bin)| bin)
        .ok_or_else(|| anyhow!("pgfence demo needs the PostgreSQL server binaries (initdb, postgres): {HOW}"))
}

impl Cluster {
    /// Runs `initdb` in a new temp dir and starts the server; returns once it accepts connections.
    pub async fn start(bin_dir: PathBuf) -> anyhow::Result<Cluster> {
        let root = make_temp_dir()?;
        // From here on, Drop removes the directory whatever fails.
        let mut cluster = Cluster {
            bin_dir,
            root,
            port: free_port()?,
            server: None,
        };
        if running_as_root() {
            let exists = Command::new("id")
                .args(["-u", SUPERUSER])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !exists.is_ok_and(|s| s.success()) {
                bail!(
                    "as root, the demo runs Postgres as the `{SUPERUSER}` user, which does not exist: create it \
                     (`useradd --system {SUPERUSER}`; `apt-get install postgresql` does) or run the demo as another user"
                );
            }
            run(Command::new("chown").arg(SUPERUSER).arg(&cluster.root))
                .context("cannot hand the temp dir to the postgres user (as root, Postgres runs as `postgres`)")?;
        }
        run(as_postgres(&cluster.bin_dir.join("initdb"))
            .arg("-D")
            .arg(cluster.data_dir())
            .args(["-A", "trust", "-U", SUPERUSER, "--no-sync", "-E", "UTF8", "--locale=C"])
            .current_dir(&cluster.root))
        .context("initdb failed")?;
        cluster.server = Some(cluster.spawn_server()?);
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The temp dir holding the data dir, the socket and the server log.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A superuser connection to `db`, directly (not through pgfence).
    pub async fn admin(&self, db: &str) -> anyhow::Result<Client> {
        connect(self.port, db, "pgfence-demo-admin", None).await
    }

    fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    fn spawn_server(&self) -> anyhow::Result<Child> {
        let log = fs::File::create(self.root.join("server.log")).context("cannot create server.log")?;
        let mut postgres = as_postgres(&self.bin_dir.join("postgres"));
        postgres
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(&self.root);
        for setting in [
            "listen_addresses=127.0.0.1",
            "fsync=off",
            "full_page_writes=off",
            "max_connections=50",
        ] {
            postgres.args(["-c", setting]);
        }
        Command::new("sh")
            .args(["-c", WATCHDOG, "pgfence-demo-watchdog", &std::process::id().to_string()])
            .arg(&self.root)
            .arg(postgres.get_program())
            .args(postgres.get_args())
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("cannot start postgres")
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.server.as_mut().map(Child::try_wait) {
                bail!("postgres exited during startup ({status}):\n{}", self.log_tail());
            }
            if connect(self.port, "postgres", "pgfence-demo", None).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "postgres did not accept connections within {READY_TIMEOUT:?}:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Stops the server (fast shutdown, then a kill if it lingers) and removes the temp dir.
    /// Idempotent; also run on drop.
    pub fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            // The watchdog leads the process group the postmaster runs in.
            let group = format!("-{}", server.id());
            let pid = fs::read_to_string(self.data_dir().join("postmaster.pid"))
                .ok()
                .and_then(|p| p.lines().next().map(|l| l.trim().to_owned()));
            match &pid {
                // SIGINT: Postgres' fast shutdown (roll back sessions, checkpoint, exit).
                Some(pid) => signal(&["-INT", pid]),
                // Still starting (a Ctrl-C in the demo's first second): no pid file to read,
                // so the whole group, whatever of it has started, gets SIGTERM. Not SIGINT or
                // SIGQUIT: the watchdog's shell started the server in the background, which
                // ignores those two until Postgres sets its own handlers; `runuser` passes
                // SIGTERM on, and Postgres reads it as a shutdown that waits for sessions (it
                // has none yet).
                None => signal(&["-TERM", "--", &group]),
            }
            // Woken, should any of it be stopped.
            signal(&["-CONT", "--", &group]);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while server.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = server.kill();
                    let _ = server.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // The watchdog may go before the postmaster (killed, or signalled with it): wait
            // for the group to empty before its directory is removed, then kill what is left.
            while group_alive(server.id()) {
                if Instant::now() > deadline {
                    signal(&["-KILL", "--", &group]);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if self.root.exists() {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether a process of group `pgid` is still running (zombies, which only wait for a
/// parent to reap them, do not count).
fn group_alive(pgid: u32) -> bool {
    let Ok(procs) = fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|entry| {
        let stat = fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
        let mut fields = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace();
        let state = fields.next();
        let group = fields.nth(1).and_then(|g| g.parse::<u32>().ok());
        group == Some(pgid) && !matches!(state, Some("Z" | "X"))
    })
}

/// Runs `kill` with `args` (nothing to signal is no error here).
fn signal(args: &[&str]) {
    let _ = Command::new("kill").args(args).stderr(Stdio::null()).status();
}

/// Connects to 127.0.0.1:`port`/`db` as the superuser, optionally with libpq `options`
/// (e.g. `-c pgfence.epoch=1`), and drives the connection in a task.
pub async fn connect(port: u16, db: &str, application: &str, options: Option<&str>) -> anyhow::Result<Client> {
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user(SUPERUSER)
        .dbname(db)
        .application_name(application)
        .connect_timeout(Duration::from_secs(5));
    if let Some(options) = options {
        config.options(options);
    }
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        // Ends with an error when the server goes away at the end of the demo; nothing to report.
        let _ = connection.await;
    });
    Ok(client)
}

fn make_temp_dir() -> anyhow::Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("pgfence-demo-{}-{nanos:x}", std::process::id()));
    fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// A port on 127.0.0.1 that was free a moment ago (Postgres binds it itself).
fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

fn running_as_root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// `program` as the `postgres` user when we are root, else as ourselves.
fn as_postgres(program: &Path) -> Command {
    if running_as_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", SUPERUSER, "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// Runs a setup command; its output is shown only when it fails.
fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let output = cmd
        .output()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if output.status.success() {
        return Ok(());
    }
    bail!(
        "{:?} exited with {}:\n{}{}",
        cmd.get_program(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
