//! The `pgfence` command: CLI → telemetry → config → run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use pgfence::config::{Config, RawConfig, upstream_is_listen, upstream_reaches_listen};
use pgfence::server::{Server, Shutdown};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "pgfence",
    version,
    about = "A PostgreSQL proxy that enforces fencing tokens on writes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// TOML configuration file.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Listen address (overrides the config's `listen`).
        #[arg(long)]
        listen: Option<String>,
        /// Upstream Postgres `host:port` (overrides the config's `upstream`).
        #[arg(long)]
        upstream: Option<String>,
    },
    /// Install or upgrade the `pgfence` schema in one database (idempotent).
    Init {
        /// The database to install into, e.g. postgres://user@127.0.0.1:5432/app (or the
        /// config's `database_url`). What it leaves out comes from PGHOST, PGPORT, PGUSER, PGDATABASE,
        /// PGPASSWORD and the password file (PGPASSFILE, default ~/.pgpass), as with psql.
        #[arg(long)]
        database_url: Option<String>,
        /// With a config, also register its fences and install their lease triggers.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Show fencing at work: a throwaway Postgres, the proxy, two workers and a paused leader.
    Demo,
    /// Validate a configuration file.
    CheckConfig {
        /// TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo narrates on stdout; the proxy's routine INFO lines would only interleave with it.
    let default_level = if matches!(cli.command, Command::Demo) {
        "warn"
    } else {
        "info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(default_level))
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: not in log files, pipes or journals.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        // A log line stderr cannot take (a full disk, a closed pipe) is lost; reporting that
        // on the same stderr would panic and take every session with it.
        .log_internal_errors(false)
        .init();
    // `serve` reads its config first: the number of threads comes from it.
    let (command, workers) = match cli.command {
        Command::Serve {
            config,
            listen,
            upstream,
        } => match load(config.as_ref(), listen, upstream) {
            Ok(c) => {
                warn_if_unfenced(&c);
                let workers = c.workers;
                (Run::Serve(Arc::new(c)), workers)
            }
            Err(e) => {
                pgfence::complain!("pgfence: {e:#}");
                return ExitCode::FAILURE;
            }
        },
        other => (Run::Other(other), 0),
    };
    let runtime = match runtime(workers) {
        Ok(r) => r,
        Err(e) => {
            pgfence::complain!("pgfence: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The runtime runs on a thread of its own, whose stack is the size every worker gets.
    let main = std::thread::Builder::new()
        .name("pgfence".into())
        .stack_size(THREAD_STACK)
        .spawn(move || match command {
            Run::Serve(config) => runtime.block_on(serve(config)),
            Run::Other(command) => runtime.block_on(run(command)),
        });
    let result = match main.map(std::thread::JoinHandle::join) {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(anyhow::anyhow!("the runtime thread panicked")),
        Err(e) => Err(anyhow::anyhow!("cannot start the runtime thread: {e}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            pgfence::complain!("pgfence: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `RUST_LOG`, else `default_level`. sqlparser logs every text it parses, and each token of
/// it, at debug level: statement text (passwords in `ALTER ROLE`, values) has no place in a
/// proxy's log, so it stays at warn unless `RUST_LOG` names it.
fn log_filter(default_level: &str) -> EnvFilter {
    let asked = std::env::var("RUST_LOG").unwrap_or_default();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    if asked.contains("sqlparser") {
        return filter;
    }
    match "sqlparser=warn".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// What `main` runs: `serve` with its config already loaded, or another command.
enum Run {
    Serve(Arc<Config>),
    Other(Command),
}

/// Stack of every thread that runs sessions. Statement analysis works on sqlparser's
/// syntax trees, and a tree's depth follows its text: `1+1+…+1` within the 64 KiB
/// that pgfence parses is a chain about 32 000 deep, which sqlparser builds in a loop
/// but drops (and prints) recursively, more than a default 2 MiB thread stack holds.
/// A stack overflow aborts the whole process, not one session, so every thread gets
/// room for the deepest tree with a wide margin. Only the pages used are ever mapped.
const THREAD_STACK: usize = 64 * 1024 * 1024;

/// One thread (like PgBouncer: the least CPU per query, no cross-thread wake-ups) or a
/// work-stealing pool; 0 means one thread per CPU.
fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if workers == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if workers > 1 {
            b.worker_threads(workers);
        }
        b.thread_stack_size(THREAD_STACK).enable_all().build()
    }
}

async fn serve(config: Arc<Config>) -> anyhow::Result<()> {
    match pgfence::server::fit_open_files(config.max_client_conn) {
        Some(files) if files.now < files.needed => warn!(
            soft = files.now,
            hard = files.hard,
            "open-file limit allows about {} client connections, below max_client_conn = {}; \
             raise the hard limit (ulimit -Hn, LimitNOFILE=) to at least {}",
            files.sessions(),
            config.max_client_conn,
            files.needed
        ),
        Some(files) if files.now != files.was => {
            info!(
                from = files.was,
                to = files.now,
                "raised the open-file limit for max_client_conn"
            );
        }
        _ => {}
    }
    let server = Server::bind(config.clone())
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    // Spelled differently from `listen`, the upstream may still be pgfence itself. One that
    // does not resolve now is left to each session's connect.
    if let (Ok(listen), Ok(upstream)) = (server.local_addr(), tokio::net::lookup_host(&config.upstream).await) {
        let upstream: Vec<_> = upstream.collect();
        if let Some(a) = upstream_reaches_listen(&[listen], &upstream) {
            anyhow::bail!(upstream_is_listen(&config.upstream, a));
        }
    }
    let shutdown = Shutdown::default();
    tokio::spawn(signals(shutdown.clone()));
    server.run(shutdown).await;
    Ok(())
}

fn load(path: Option<&PathBuf>, listen: Option<String>, upstream: Option<String>) -> anyhow::Result<Config> {
    let mut raw = match path {
        Some(p) => RawConfig::from_file(p)?,
        None => RawConfig::default(),
    };
    raw.listen = listen.or(raw.listen);
    raw.upstream = upstream.or(raw.upstream);
    let config = raw.validate()?;
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    Ok(config)
}

/// A proxy without fences is a plain relay (a supported use), but a forgotten `--config` or
/// an empty one looks the same from outside: said where it is set up.
fn warn_if_unfenced(c: &Config) {
    if c.fences.is_empty() {
        tracing::warn!("no [[fence]] is configured: every write is relayed unchecked, as by a plain proxy");
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve {
            config,
            listen,
            upstream,
        } => {
            let c = load(config.as_ref(), listen, upstream)?;
            warn_if_unfenced(&c);
            serve(Arc::new(c)).await
        }
        Command::Init { database_url, config } => {
            let (fences, from_config) = match config {
                Some(p) => {
                    let c = load(Some(&p), None, None)?;
                    (c.fences, c.database_url)
                }
                None => (Vec::new(), None),
            };
            let Some(url) = database_url.or(from_config) else {
                anyhow::bail!("init needs --database-url (or database_url in the config)");
            };
            let (db, warnings) =
                pgfence::conninfo::parse(&url, |name| std::env::var(name).ok()).map_err(|e| match e {
                    pgfence::conninfo::ConninfoError::Url(e) => anyhow::Error::new(e).context("invalid database URL"),
                    e => anyhow::Error::new(e),
                })?;
            for warning in warnings {
                tracing::warn!("{warning}");
            }
            let (mut client, connection) = db
                .connect(tokio_postgres::NoTls)
                .await
                .with_context(|| format!("cannot connect to the database at {}", pgfence::conninfo::describe(&db)))?;
            tokio::spawn(connection);
            let report = pgfence::fence::install::install(&mut client, &fences).await?;
            pgfence::say!("{report}");
            Ok(())
        }
        Command::Demo => pgfence::demo::run().await,
        Command::CheckConfig { config } => {
            let c = load(Some(&config), None, None)?;
            warn_if_unfenced(&c);
            // Syntax alone lets `1.2.3.4.5:6432` through; `serve` would fail to bind it.
            let addrs: Vec<_> = match tokio::net::lookup_host(&c.listen).await {
                Ok(addrs) => addrs.collect(),
                Err(e) => anyhow::bail!("listen = {:?}: cannot resolve the address: {e}", c.listen),
            };
            // Nor an address of another host. The port itself may be taken only while another
            // process runs (an older pgfence during an upgrade): that stays `serve`'s to say,
            // so the check binds the address on a port of the system's choosing.
            let mut last = None;
            let local = addrs.iter().any(|a| match std::net::TcpListener::bind((a.ip(), 0)) {
                Ok(_) => true,
                Err(e) => {
                    last = Some(e);
                    false
                }
            });
            if !local {
                let why = last.map_or_else(|| "it resolves to no address".to_owned(), |e| e.to_string());
                anyhow::bail!(
                    "listen = {:?}: pgfence cannot listen there on this host: {why}",
                    c.listen
                );
            }
            // The upstream may resolve only where pgfence runs: said, not refused.
            match tokio::net::lookup_host(&c.upstream).await {
                Ok(upstream) => {
                    let upstream: Vec<_> = upstream.collect();
                    if let Some(a) = upstream_reaches_listen(&addrs, &upstream) {
                        anyhow::bail!(upstream_is_listen(&c.upstream, a));
                    }
                }
                Err(e) => tracing::warn!("upstream = {:?}: cannot resolve the address here: {e}", c.upstream),
            }
            pgfence::say!(
                "{}: ok (listen {}, upstream {}, {} fence(s))",
                config.display(),
                c.listen,
                c.upstream,
                c.fences.len()
            );
            Ok(())
        }
    }
}

/// SIGTERM drains; SIGINT, SIGQUIT (Postgres' immediate shutdown) or a second SIGTERM exit
/// fast. SIGHUP, which PgBouncer and Postgres take as "reload", and SIGUSR1/SIGUSR2,
/// PgBouncer's PAUSE and RESUME, would otherwise end the process and drop every session
/// without a word: they are logged and ignored, since pgfence reads its config only at start
/// and has no pause.
async fn signals(shutdown: Shutdown) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut quit), Ok(mut hup), Ok(mut usr1), Ok(mut usr2)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::quit()),
        signal(SignalKind::hangup()),
        signal(SignalKind::user_defined1()),
        signal(SignalKind::user_defined2()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    let mut draining = false;
    loop {
        let sigterm = tokio::select! {
            _ = term.recv() => true,
            _ = int.recv() => false,
            _ = quit.recv() => false,
            _ = hup.recv() => {
                tracing::warn!("SIGHUP ignored: pgfence reads its config only at start; restart it to apply a changed config");
                continue;
            }
            _ = usr1.recv() => {
                tracing::warn!("SIGUSR1 ignored: pgfence has no pause (SIGTERM drains, SIGINT closes)");
                continue;
            }
            _ = usr2.recv() => {
                tracing::warn!("SIGUSR2 ignored: pgfence has no pause to resume from");
                continue;
            }
        };
        if sigterm && !draining {
            tracing::info!("SIGTERM: draining");
            shutdown.drain.cancel();
            draining = true;
            continue;
        }
        tracing::info!(
            "{}",
            if draining {
                "second signal: closing"
            } else {
                "SIGINT or SIGQUIT: closing"
            }
        );
        break;
    }
    shutdown.fast.cancel();
}
