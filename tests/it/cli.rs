//! The command line: check-config, init, serve with bad input.

use std::process::Command;

use crate::common::pg::Cluster;
use crate::common::raw::{Raw, startup_packet};

fn pgfence(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .args(args)
        .output()
        .expect("run pgfence");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `pgfence ARGS` from async code.
async fn pgfence_async(args: &[&str]) -> (bool, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || pgfence(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .unwrap()
}

/// The schema version `pgfence init` left in `db`.
async fn installed_version(cluster: &Cluster, db: &str) -> i32 {
    cluster
        .admin(db)
        .await
        .query_one("SELECT max(version) FROM pgfence.schema_version", &[])
        .await
        .unwrap()
        .get(0)
}

/// A config file in its own scratch directory, removed when this is dropped.
struct ConfigFile {
    path: String,
    _dir: crate::common::ScratchDir,
}

impl std::ops::Deref for ConfigFile {
    type Target = str;

    fn deref(&self) -> &str {
        &self.path
    }
}

fn write_config(text: &str) -> ConfigFile {
    let dir = crate::common::ScratchDir::new("cli");
    let path = dir.join("pgfence.toml");
    std::fs::write(&path, text).unwrap();
    ConfigFile {
        path: path.display().to_string(),
        _dir: dir,
    }
}

#[test]
fn check_config_accepts_the_contract_example_and_explains_errors() {
    let good = write_config(
        "listen = \"127.0.0.1:6432\"\nupstream = \"127.0.0.1:5432\"\n[[fence]]\nname = \"invoice-sweeper\"\n\
         database = \"app\"\ntables = [\"public.sweep_state\", \"billing.invoices\"]\nmode = \"reject\"\n\
         [fence.lease]\ntable = \"public.leader_lease\"\n",
    );
    let (ok, text) = pgfence(&["check-config", "--config", &good]);
    assert!(ok, "{text}");
    assert!(!text.contains("WARN"), "{text}");
    for (bad, expect) in [
        ("listen = \"127.0.0.1:6432\"\nlistne = 1\n", "unknown field"),
        (
            "[[fence]]\nname = \"a\"\ntables = [\"t\"]\nmode = \"rewrite\"\n",
            "epoch_column",
        ),
        (
            "[[fence]]\nname = \"a\"\ntables = [\"t\"]\n[[fence]]\nname = \"b\"\ntables = [\"t\"]\n",
            "at most one fence",
        ),
        ("upstream = 5432\n", "upstream"),
        ("listen = \"1.2.3.4.5:6432\"\n", "cannot resolve the address"),
        // TEST-NET-1: valid, but no address of this host.
        ("listen = \"192.0.2.1:6432\"\n", "cannot listen there on this host"),
        (
            "[[fence]]\nname = \"a\"\ntables = [\"t\", \"leader_lease\"]\n[fence.lease]\ntable = \"leader_lease\"\n",
            "lease table public.leader_lease is also a fenced table",
        ),
    ] {
        let (ok, text) = pgfence(&["check-config", "--config", &write_config(bad)]);
        assert!(!ok, "{bad:?} must be refused");
        assert!(text.contains(expect), "{bad:?}: {text}");
    }
    let (ok, text) = pgfence(&["check-config", "--config", "/nonexistent/pgfence.toml"]);
    assert!(!ok && text.contains("cannot read"), "{text}");
    // The cause is said once.
    assert_eq!(text.matches("No such file or directory").count(), 1, "{text}");
    // Valid but without effect: accepted, with a warning.
    let ignored = write_config("[[fence]]\nname = \"a\"\ntables = [\"t\"]\nepoch_column = \"last_epoch\"\n");
    let (ok, text) = pgfence(&["check-config", "--config", &ignored]);
    assert!(ok, "{text}");
    assert!(
        text.contains("WARN") && text.contains("epoch_column is read only with mode"),
        "{text}"
    );
    // Written to a pipe, not a terminal: no colour codes in it.
    assert!(!text.contains('\u{1b}'), "{text:?}");
    // A port another process holds is `serve`'s to report (it may be an older pgfence that
    // is about to stop).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let busy = write_config(&format!("listen = \"127.0.0.1:{port}\"\n"));
    let (ok, text) = pgfence(&["check-config", "--config", &busy]);
    assert!(ok, "{text}");
    // No fence at all: a plain relay, valid, and said.
    assert!(
        text.contains("WARN") && text.contains("no [[fence]] is configured: every write is relayed unchecked"),
        "{text}"
    );
    // The upstream may resolve only where pgfence runs: a warning, not a refusal.
    let elsewhere = write_config("upstream = \"db.invalid:5432\"\n");
    let (ok, text) = pgfence(&["check-config", "--config", &elsewhere]);
    assert!(ok, "{text}");
    assert!(
        text.contains("WARN") && text.contains("cannot resolve the address here"),
        "{text}"
    );
}

/// A report written to a closed stdout (`pgfence check-config … | head -0`) is lost, and the
/// command still succeeds; it panicked with "failed printing to stdout".
#[test]
fn a_closed_stdout_loses_the_report_not_the_run() {
    use std::io::Read as _;
    use std::process::Stdio;
    let good = write_config("listen = \"127.0.0.1:6432\"\n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .args(["check-config", "--config", &good])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success() && !err.contains("panicked"), "{status:?}: {err}");
}

/// A failure reported to a stderr that takes nothing (`2>/dev/full`) still exits with the
/// failure's code, not a panic's (101).
#[test]
fn a_full_stderr_keeps_the_failure_exit_code() {
    let bad = write_config("listen = \"127.0.0.1:6432\"\nno_such_key = 1\n");
    for args in [
        &["check-config", "--config", &bad][..],
        &["serve", "--config", &bad][..],
    ] {
        let status = Command::new(env!("CARGO_BIN_EXE_pgfence"))
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create("/dev/full").unwrap())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(1), "{args:?}");
    }
}

#[tokio::test]
async fn init_twice_via_the_command_line() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", cluster.port());
    for _ in 0..2 {
        let (ok, text) = pgfence_async(&["init", "--database-url", &url]).await;
        assert!(ok, "{text}");
    }
    assert_eq!(
        installed_version(cluster, &db).await,
        pgfence::fence::install::SCHEMA_VERSION
    );
}

/// A role that may not create the schema is told so once, with the SQLSTATE; once it is
/// installed, the same role finds it up to date.
#[tokio::test]
async fn init_without_the_privilege_says_why_once_and_finds_an_installed_schema_up_to_date() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let admin = cluster.admin(&db).await;
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS pgfence_nocreate; CREATE ROLE pgfence_nocreate LOGIN; \
             REVOKE CREATE ON DATABASE {db} FROM PUBLIC"
        ))
        .await
        .unwrap();
    let url = format!("postgres://pgfence_nocreate@127.0.0.1:{}/{db}", cluster.port());
    let (ok, text) = pgfence_async(&["init", "--database-url", &url]).await;
    assert!(!ok, "{text}");
    assert_eq!(text.matches("permission denied for database").count(), 1, "{text}");
    assert!(text.contains("(42501)"), "{text}");
    // Once installed by a role that may, the schema is up to date for this one too: it
    // needs no privilege to learn that.
    let owner = format!("postgres://postgres@127.0.0.1:{}/{db}", cluster.port());
    let (ok, text) = pgfence_async(&["init", "--database-url", &owner]).await;
    assert!(ok, "{text}");
    let (ok, text) = pgfence_async(&["init", "--database-url", &url]).await;
    assert!(ok && text.contains("up to date (version"), "{text}");
}

#[test]
fn serve_with_a_bad_config_exits_non_zero() {
    let (ok, text) = pgfence(&["serve", "--config", &write_config("bogus = true\n")]);
    assert!(!ok);
    assert!(text.contains("unknown field"), "{text}");
}

/// An upstream spelled unlike `listen` that still reaches pgfence itself (`0.0.0.0` and
/// `127.0.0.1`, `localhost` and `127.0.0.1`) is refused by check-config, and by serve before it
/// accepts anything; another port is fine.
#[test]
fn an_upstream_that_resolves_to_the_listen_address_is_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = |listen: &str, upstream: &str| {
        write_config(&format!(
            "listen = \"{listen}:{port}\"\nupstream = \"{upstream}:{port}\"\n"
        ))
    };
    for (listen, upstream) in [
        ("0.0.0.0", "127.0.0.1"),
        ("127.0.0.1", "localhost"),
        ("localhost", "0.0.0.0"),
    ] {
        let (ok, text) = pgfence(&["check-config", "--config", &config(listen, upstream)]);
        assert!(!ok, "{listen} / {upstream}: {text}");
        assert!(text.contains("is pgfence's own listen address"), "{text}");
    }
    let other = write_config(&format!(
        "listen = \"0.0.0.0:{port}\"\nupstream = \"127.0.0.1:{}\"\n",
        port ^ 1
    ));
    let (ok, text) = pgfence(&["check-config", "--config", &other]);
    assert!(ok, "{text}");
    // serve binds, sees it, and exits.
    let file = config("127.0.0.1", "localhost");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .args(["serve", "--config", &file])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("serve kept running with upstream reaching itself");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains("is pgfence's own listen address"), "{text}");
}

#[tokio::test]
async fn newer_protocol_minor_gets_negotiate_protocol_version() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let proxy = crate::common::inproc::Proxy::start(cluster.port(), "").await;
    let mut packet = startup_packet(&[("user", "postgres"), ("database", &db), ("_pq_.feature", "x")]);
    packet[4..8].copy_from_slice(&((3u32 << 16) | 2).to_be_bytes());
    let mut raw = Raw::connect(proxy.port()).await;
    raw.send(&packet).await;
    let msgs = raw.read_until(|m| m.tag == b'Z').await;
    let v = msgs.first().expect("a reply");
    assert_eq!(v.tag, b'v', "{msgs:?}");
    // Postgres sends the whole newest version it supports, 3.0 (libpq 18 refuses a bare 0).
    assert_eq!(
        &v.body[..4],
        &(3u32 << 16).to_be_bytes(),
        "newest version supported: 3.0"
    );
    assert!(String::from_utf8_lossy(&v.body).contains("_pq_.feature"));
    assert_eq!(msgs.last().unwrap().tag, b'Z');
    assert_eq!(crate::common::raw::tags(&raw.simple("SELECT 1").await), "TDCZ");
}

#[tokio::test]
async fn init_takes_its_database_url_from_the_config_too() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let path = write_config(&format!(
        "database_url = \"postgres://postgres@127.0.0.1:{}/{db}\"\n",
        cluster.port()
    ));
    let (ok, text) = pgfence_async(&["init", "--config", &path]).await;
    assert!(ok, "{text}");
    assert_eq!(
        installed_version(cluster, &db).await,
        pgfence::fence::install::SCHEMA_VERSION
    );
    // Neither the flag nor the key: a clear error.
    let (ok, text) = pgfence(&["init", "--config", &write_config("")]);
    assert!(!ok && text.contains("--database-url"), "{text}");
}

/// A server on a free port that asks for a cleartext password, and refuses once it has it:
/// gives the port and, at the end, the startup packet's parameters and the password sent.
async fn password_catcher() -> (u16, tokio::task::JoinHandle<(Vec<(String, String)>, String)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let len = s.read_u32().await.unwrap() as usize;
        let mut startup = vec![0u8; len - 4];
        s.read_exact(&mut startup).await.unwrap();
        // After the protocol version: name, value, … and a final NUL.
        let words: Vec<String> = startup[4..]
            .split(|b| *b == 0)
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        let params = words
            .chunks(2)
            .filter(|kv| kv.len() == 2 && !kv[0].is_empty())
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect();
        s.write_all(b"R\0\0\0\x08\0\0\0\x03").await.unwrap();
        assert_eq!(s.read_u8().await.unwrap(), b'p');
        let len = s.read_u32().await.unwrap() as usize;
        let mut password = vec![0u8; len - 4];
        s.read_exact(&mut password).await.unwrap();
        let mut err = b"SFATAL\0C28P01\0Mpassword authentication failed\0\0".to_vec();
        let mut msg = vec![b'E'];
        msg.extend_from_slice(&((err.len() + 4) as u32).to_be_bytes());
        msg.append(&mut err);
        s.write_all(&msg).await.unwrap();
        (params, String::from_utf8(password).unwrap())
    });
    (port, server)
}

/// What [`password_catcher`] caught; fails when pgfence never got that far.
async fn caught(server: tokio::task::JoinHandle<(Vec<(String, String)>, String)>) -> (Vec<(String, String)>, String) {
    tokio::time::timeout(std::time::Duration::from_secs(20), server)
        .await
        .expect("pgfence init never sent a password")
        .unwrap()
}

/// Runs `pgfence init --database-url url` with these environment variables, and only these
/// of libpq's.
async fn init_with_env(url: String, env: Vec<(&'static str, String)>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgfence"));
        cmd.args(["init", "--database-url", &url]);
        for var in ["PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD", "PGPASSFILE"] {
            cmd.env_remove(var);
        }
        cmd.envs(env).output().expect("run pgfence")
    })
    .await
    .unwrap()
}

/// libpq's PGPASSWORD: a URL without a password takes it from there.
#[tokio::test]
async fn init_uses_pgpassword_when_the_url_has_no_password() {
    let (port, server) = password_catcher().await;
    let url = format!("postgres://someone@127.0.0.1:{port}/x");
    let out = init_with_env(url, vec![("PGPASSWORD", "s3cret".into())]).await;
    assert!(!out.status.success());
    assert_eq!(caught(server).await.1, "s3cret\0");
}

/// As psql: what the URL leaves out comes from PGPORT, PGUSER and PGDATABASE, and the
/// password from the password file when PGPASSWORD is not set.
#[tokio::test]
async fn init_takes_what_the_url_leaves_out_from_libpq_variables_and_the_password_file() {
    let (port, server) = password_catcher().await;
    let dir = std::env::temp_dir().join(format!("pgfence-cli-pgpass-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pgpass");
    std::fs::write(
        &file,
        format!("127.0.0.1:{port}:otherdb:someone:wrong\n127.0.0.1:{port}:appdb:someone:from\\:file\n"),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let env = vec![
        ("PGPORT", port.to_string()),
        ("PGUSER", "someone".to_owned()),
        ("PGDATABASE", "appdb".to_owned()),
        ("PGPASSFILE", file.to_str().unwrap().to_owned()),
    ];
    let out = init_with_env("postgres://127.0.0.1".into(), env).await;
    assert!(!out.status.success());
    let (params, password) = caught(server).await;
    assert!(params.contains(&("user".into(), "someone".into())), "{params:?}");
    assert!(params.contains(&("database".into(), "appdb".into())), "{params:?}");
    assert_eq!(password, "from:file\0");
    // A password file others can read is ignored, with libpq's warning.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let (port2, server2) = password_catcher().await;
    let url = format!("postgres://someone@127.0.0.1:{port2}/appdb");
    let out = init_with_env(url, vec![("PGPASSFILE", file.to_str().unwrap().to_owned())]).await;
    assert!(!out.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("group or world access"), "{text}");
    // No password to send: the client gives up before answering the server's request.
    server2.abort();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// As psql: with no host in the URL nor in PGHOST, init connects to the server's Unix
/// socket in the default directory; an invalid PGPORT is refused, not ignored.
#[tokio::test]
async fn init_without_a_host_uses_the_default_unix_socket_and_refuses_a_bad_pgport() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let port = cluster.port();
    let name = format!(".s.PGSQL.{port}");
    // The cluster's socket, seen in /tmp (the last default directory) under its port's name.
    let link = std::path::Path::new("/tmp").join(&name);
    let ours = !link.exists() && std::os::unix::fs::symlink(cluster.socket_dir().join(&name), &link).is_ok();
    let out = init_with_env(
        format!("postgres:///{db}?user=postgres"),
        vec![("PGPORT", port.to_string())],
    )
    .await;
    if ours {
        std::fs::remove_file(&link).unwrap();
    }
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let admin = cluster.admin(&db).await;
    let row = admin
        .query_one("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgfence'", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    // Nowhere to connect: the error names the socket tried.
    let out = init_with_env("postgres:///x?user=postgres&port=1".into(), vec![]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to the database at socket /"), "{err}");
    assert!(err.contains("/.s.PGSQL.1"), "{err}");
    for (port, says) in [
        (
            "5432x",
            "invalid integer value \"5432x\" for connection option \"port\"",
        ),
        ("70000", "invalid port number: \"70000\""),
    ] {
        let out = init_with_env(format!("postgres://127.0.0.1/{db}"), vec![("PGPORT", port.into())]).await;
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
}

/// A fence of one database whose lease table is not there cannot work (its writes would
/// fail with PF005): `init --config` says so and fails, rather than report success. A fence
/// for any database only skips the databases without its lease table.
#[tokio::test]
async fn init_refuses_a_fence_of_this_database_without_its_lease_table() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", cluster.port());
    let fence = |database: &str| {
        write_config(&format!(
            "[[fence]]\nname = \"f\"\n{database}tables = [\"t\"]\n[fence.lease]\ntable = \"public.leader_lease\"\n"
        ))
    };
    let (ok, text) = pgfence_async(&[
        "init",
        "--database-url",
        &url,
        "--config",
        &fence(&format!("database = \"{db}\"\n")),
    ])
    .await;
    assert!(!ok, "{text}");
    assert!(text.contains("does not exist in the fence's database"), "{text}");
    let (ok, text) = pgfence_async(&["init", "--database-url", &url, "--config", &fence("")]).await;
    assert!(ok && text.contains("not in this database"), "{text}");
    // What follows for this database's writes, and the two ways out.
    assert!(
        text.contains("fail with PF005") && text.contains("run init again") && text.contains("`database = "),
        "{text}"
    );
}

/// `init --config` looks at each rewrite table's epoch column: a missing one, or one that
/// is not `bigint`, is named in a warning (the install still succeeds: the table may be
/// changed after), and a `bigint` one (or a domain over `bigint`) is not.
#[tokio::test]
async fn init_warns_of_an_epoch_column_missing_or_not_bigint() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    cluster
        .admin(&db)
        .await
        .batch_execute(
            "CREATE TABLE no_col (id int); CREATE TABLE small (id int, last_epoch int); \
             CREATE TABLE fine (id int, last_epoch bigint); CREATE DOMAIN big AS bigint; \
             CREATE TABLE fine_domain (id int, last_epoch big); \
             CREATE TABLE dropped (id int, last_epoch bigint); ALTER TABLE dropped DROP COLUMN last_epoch",
        )
        .await
        .unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", cluster.port());
    let config = write_config(
        "[[fence]]\nname = \"f\"\nmode = \"rewrite\"\nepoch_column = \"last_epoch\"\n\
         tables = [\"no_col\", \"small\", \"fine\", \"fine_domain\", \"dropped\", \"absent\"]\n",
    );
    let (ok, text) = pgfence_async(&["init", "--database-url", &url, "--config", &config]).await;
    assert!(ok, "{text}");
    assert!(
        text.contains("warning: table public.no_col has no epoch column \"last_epoch\""),
        "{text}"
    );
    assert!(
        text.contains("warning: table public.dropped has no epoch column \"last_epoch\""),
        "{text}"
    );
    assert!(
        text.contains("warning: epoch column \"last_epoch\" of table public.small is integer, not bigint"),
        "{text}"
    );
    assert!(!text.contains("public.fine"), "{text}");
    assert!(!text.contains("public.fine_domain"), "a domain over bigint: {text}");
    assert!(
        text.contains("note: table public.absent does not exist here yet"),
        "{text}"
    );
    // Reject mode has no epoch column to look at, even with one configured (ignored).
    let config = write_config("[[fence]]\nname = \"g\"\ntables = [\"no_col\"]\nepoch_column = \"last_epoch\"\n");
    let (ok, text) = pgfence_async(&["init", "--database-url", &url, "--config", &config]).await;
    assert!(ok && !text.contains("warning"), "{text}");
}

/// `serve` raises the soft open-file limit so that `max_client_conn` sessions fit (two
/// descriptors each, and some to spare), up to the hard limit, and says so; where the hard
/// limit is too low it warns at start with the number of sessions that fit.
#[test]
fn serve_fits_the_open_file_limit_to_max_client_conn() {
    use crate::common::free_port;
    use crate::common::proxy::{ProxyProcess, proxy_toml};
    let soft_limit = |p: &ProxyProcess| -> u64 {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", p.pid())).unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    };
    let config = proxy_toml(free_port(), free_port(), "max_client_conn = 300");
    let raised = ProxyProcess::start_after(&config, "ulimit -S -n 100");
    assert_eq!(soft_limit(&raised), 2 * 300 + 64, "{}", raised.log());
    assert!(raised.log().contains("raised the open-file limit"), "{}", raised.log());
    assert!(!raised.log().contains("open-file limit allows"), "{}", raised.log());
    let config = proxy_toml(free_port(), free_port(), "max_client_conn = 300");
    let capped = ProxyProcess::start_after(&config, "ulimit -S -n 100 && ulimit -H -n 200");
    assert_eq!(soft_limit(&capped), 200, "{}", capped.log());
    assert!(
        capped
            .log()
            .contains("open-file limit allows about 68 client connections, below max_client_conn = 300"),
        "{}",
        capped.log()
    );
    // Enough already: nothing changes, nothing is said.
    let config = proxy_toml(free_port(), free_port(), "max_client_conn = 10");
    let fits = ProxyProcess::start_after(&config, "ulimit -S -n 100");
    assert_eq!(soft_limit(&fits), 100);
    assert!(!fits.log().contains("open-file limit"), "{}", fits.log());
}

/// `serve` says what `check-config` says of a config without fences, where it starts; and at
/// debug level its log carries no statement text (sqlparser would log each text it parses).
#[test]
fn serve_warns_without_fences_and_logs_no_statement_text() {
    use crate::common::free_port;
    use crate::common::proxy::{ProxyProcess, proxy_toml};
    let proxy = ProxyProcess::start(&proxy_toml(free_port(), free_port(), ""));
    let log = proxy.log();
    assert!(
        log.contains("WARN") && log.contains("no [[fence]] is configured: every write is relayed unchecked"),
        "{log}"
    );
    let cluster = Cluster::shared();
    let port = free_port();
    let fenced = proxy_toml(port, cluster.port(), "[[fence]]\nname = \"f\"\ntables = [\"t\"]\n");
    let proxy = ProxyProcess::start_after(&fenced, "export RUST_LOG=debug");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (mut s, _) = Raw::startup(port, &[("user", "postgres"), ("database", "postgres")]).await;
        // It names the fenced table and is no plain DML: pgfence parses it with sqlparser.
        let replies = s.simple("WITH x AS (SELECT 1) SELECT 'hunter2-secret' FROM t").await;
        assert_eq!(replies.last().map(|m| m.tag), Some(b'Z'));
    });
    let log = proxy.log();
    assert!(log.contains("DEBUG"), "{log}");
    assert!(!log.contains("hunter2-secret"), "{log}");
}
