//! The contract checked from outside, with real drivers and tools: psycopg 3, asyncpg,
//! node-postgres and pgjdbc run the scripts in `tests/drivers/` against an in-process pgfence; psql and
//! pgbench run against it with fenced tables.
//!
//! Each script prints one `PASS`/`FAIL` line per check and exits non-zero on any failure; the
//! test shows the whole output when it fails. A missing driver is a failure that says to run
//! `make setup` (CI does), never a silent pass.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::ScratchDir;
use crate::common::inproc::Proxy;
use crate::common::pg::Cluster;
use crate::common::raw::{Raw, codes, query};
use crate::fencing::{Fixture, install};

/// How long one driver script may run (it makes ~20 checks, one of them waits for a cancel).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

fn drivers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/drivers")
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Fails with a pointer to `make setup` when `probe` does not run successfully.
fn require(what: &str, probe: &mut Command) {
    let ok = probe
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{what} is not installed: run `make setup` (CI runs it before the tests)"
    );
}

/// Runs `cmd` off the runtime (so the in-process proxy keeps serving) with a deadline, and returns
/// its output. Output goes to files rather than pipes so a chatty child cannot block on a full pipe
/// while we poll it.
async fn run(mut cmd: Command, timeout: Duration) -> Output {
    tokio::task::spawn_blocking(move || {
        let dir = ScratchDir::new("pgfence-driver");
        let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&out_path).expect("create stdout file"))
            .stderr(File::create(&err_path).expect("create stderr file"))
            .spawn();
        let mut child = child.unwrap_or_else(|e| panic!("spawn {cmd:?}: {e} (run `make setup`)"));
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for child") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let out = std::fs::read_to_string(&out_path).unwrap_or_default();
                panic!("{cmd:?} did not finish within {timeout:?}; output so far:\n{out}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Output {
            status,
            stdout: std::fs::read(&out_path).unwrap_or_default(),
            stderr: std::fs::read(&err_path).unwrap_or_default(),
        }
    })
    .await
    .expect("join blocking task")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs one driver script against a fresh seed database behind pgfence and asserts it passed.
async fn run_driver_script(program: &str, script: &str) {
    run_driver_script_with(program, &[], script).await;
}

/// [`run_driver_script`] with arguments for `program` before the script.
async fn run_driver_script_with(program: &str, program_args: &[&str], script: &str) {
    let f = Fixture::new().await;
    let mut cmd = Command::new(program);
    cmd.args(program_args)
        .arg(drivers_dir().join(script))
        .args(["127.0.0.1", &f.proxy.port().to_string(), &f.db, "postgres"])
        .current_dir(drivers_dir())
        .env("PYTHONUNBUFFERED", "1");
    let out = run(cmd, SCRIPT_TIMEOUT).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success() && !stdout.contains("FAIL") && stdout.contains("PASS"),
        "{script} failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );
    assert!(!f.proxy.is_finished(), "the proxy stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg_driver_checks_pass_through_pgfence() {
    require(
        "psycopg (python)",
        Command::new(python()).args(["-c", "import psycopg"]),
    );
    run_driver_script(&python(), "py_compat.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asyncpg_driver_checks_pass_through_pgfence() {
    require(
        "asyncpg (python)",
        Command::new(python()).args(["-c", "import asyncpg"]),
    );
    run_driver_script(&python(), "asyncpg_compat.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_postgres_driver_checks_pass_through_pgfence() {
    require(
        "node-postgres (`pg` in tests/drivers/node_modules)",
        Command::new("node")
            .args(["-e", "require('pg')"])
            .current_dir(drivers_dir()),
    );
    run_driver_script("node", "node_compat.js").await;
}

/// pgjdbc, from Debian's package (`make setup` installs it).
const JDBC_JAR: &str = "/usr/share/java/postgresql.jar";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jdbc_driver_checks_pass_through_pgfence() {
    require("java", Command::new("java").arg("-version"));
    assert!(
        Path::new(JDBC_JAR).exists(),
        "pgjdbc is not installed ({JDBC_JAR}): run `make setup` (CI runs it before the tests)"
    );
    // A single-file program, compiled in memory by `java` itself.
    run_driver_script_with("java", &["-cp", JDBC_JAR], "JdbcCompat.java").await;
}

/// psql with `-v ON_ERROR_STOP=1` and the epoch in `PGOPTIONS`; returns (stdout, stderr, exit code).
async fn psql(port: u16, db: &str, epoch: Option<i64>, extra: &[&str], script: &Path) -> (String, String, i32) {
    let mut cmd = Command::new(Cluster::shared().bin("psql"));
    cmd.args([
        "-X",
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "postgres",
        "-d",
        db,
    ])
    .args(extra)
    .arg("-f")
    .arg(script)
    .env("PGCONNECT_TIMEOUT", "10")
    .env_remove("PGOPTIONS");
    if let Some(e) = epoch {
        cmd.env("PGOPTIONS", format!("-c pgfence.epoch={e}"));
    }
    let out = run(cmd, Duration::from_secs(60)).await;
    (text(&out.stdout), text(&out.stderr), out.status.code().unwrap_or(-1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_on_error_stop_script_stops_at_a_rejected_fenced_write() {
    let f = Fixture::new().await;
    let e1 = f.takeover("psql-a").await;
    let dir = ScratchDir::new("psql-fence");
    let data = dir.join("rows.csv");
    std::fs::write(&data, "10,ten,0\n11,eleven,0\n").unwrap();
    let script = dir.join("leader.sql");
    std::fs::write(
        &script,
        format!(
            "\\set ON_ERROR_STOP on\n\\set VERBOSITY verbose\nSELECT current_setting('pgfence.epoch', true) AS epoch;\n\
             INSERT INTO audit (note) VALUES ('before');\nUPDATE sweep_state SET note = 'psql' WHERE id = 1;\n\
             \\copy sweep_state FROM '{}' WITH (FORMAT csv)\nINSERT INTO audit (note) VALUES ('after');\n",
            data.display()
        ),
    )
    .unwrap();
    // The current leader: the whole script runs.
    let (out, err, code) = psql(f.proxy.port(), &f.db, Some(e1), &[], &script).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("\n {e1}\n")), "current_setting: {out}");
    assert_eq!(f.note().await.0, "psql");

    // A takeover; the old leader's script stops at its first fenced write with PF001 (psql exit 3).
    let e2 = f.takeover("psql-b").await;
    f.admin
        .batch_execute("DELETE FROM audit; DELETE FROM sweep_state WHERE id >= 10")
        .await
        .unwrap();
    f.admin
        .batch_execute("UPDATE sweep_state SET note = 'new-leader' WHERE id = 1")
        .await
        .unwrap();
    let (out, err, code) = psql(f.proxy.port(), &f.db, Some(e1), &[], &script).await;
    assert_eq!(code, 3, "ON_ERROR_STOP exits 3 on an error: {out}{err}");
    let expected = format!("ERROR:  PF001: pgfence: epoch {e1} is stale for fence \"sweeper\" (current epoch {e2})");
    assert!(err.contains(&expected), "{err}");
    assert!(err.contains("HINT:  "), "{err}");
    let audit: Vec<String> = f
        .admin
        .query("SELECT note FROM audit ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(audit, ["before"], "psql stops after the rejected statement");
    assert_eq!(f.note().await.0, "new-leader");

    // As one transaction (-1), the rejection takes the earlier statements with it.
    f.admin.batch_execute("DELETE FROM audit").await.unwrap();
    let (out, err, code) = psql(f.proxy.port(), &f.db, Some(e1), &["-1"], &script).await;
    assert_eq!(code, 3, "{out}{err}");
    let n = f.audit_rows().await;
    assert_eq!(n, 0, "a rejected single-transaction script must commit nothing");

    // No epoch at all: PF002, and the script can declare one itself with SET.
    let (_, err, code) = psql(f.proxy.port(), &f.db, None, &[], &script).await;
    assert_eq!(code, 3);
    assert!(err.contains("ERROR:  PF002: "), "{err}");
    let declare = dir.join("declare.sql");
    std::fs::write(
        &declare,
        format!("\\set ON_ERROR_STOP on\nSET pgfence.epoch = {e2};\nUPDATE sweep_state SET note = 'psql-set' WHERE id = 1;\n"),
    )
    .unwrap();
    let (out, err, code) = psql(f.proxy.port(), &f.db, None, &[], &declare).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(f.note().await.0, "psql-set");
}

/// The four pgbench tables in one fence without a lease (the guard raises the HWM to the first
/// epoch that writes).
const PGBENCH_FENCE: &str = "[[fence]]\nname = \"bench\"\n\
    tables = [\"pgbench_accounts\", \"pgbench_branches\", \"pgbench_tellers\", \"pgbench_history\"]\n";

async fn pgbench(port: u16, db: &str, epoch: i64, args: &[&str]) -> Output {
    let mut cmd = Command::new(Cluster::shared().bin("pgbench"));
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
        .args(args)
        .arg(db)
        .env("PGOPTIONS", format!("-c pgfence.epoch={epoch}"));
    run(cmd, Duration::from_secs(120)).await
}

/// A database with the pgbench fence installed and initialised through pgfence with `epoch`
/// (`pgbench -i` drops, creates, COPYs and truncates the fenced tables: all fenced writes).
async fn pgbench_setup(epoch: i64) -> (String, Proxy) {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut admin = cluster.admin(&db).await;
    install(&mut admin, cluster.port(), PGBENCH_FENCE).await;
    let proxy = Proxy::start(cluster.port(), PGBENCH_FENCE).await;
    let init = pgbench(proxy.port(), &db, epoch, &["-i", "-s", "1", "-q"]).await;
    assert!(init.status.success(), "pgbench -i: {}", text(&init.stderr));
    (db, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_on_fenced_tables_has_no_failures_with_the_current_epoch() {
    let (db, proxy) = pgbench_setup(5).await;
    for mode in ["simple", "extended", "prepared"] {
        let out = pgbench(
            proxy.port(),
            &db,
            5,
            &["-M", mode, "-c", "4", "-j", "2", "-t", "50", "-n"],
        )
        .await;
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "-M {mode}: {stdout}{}", text(&out.stderr));
        assert!(
            stdout.contains("number of failed transactions: 0"),
            "-M {mode}: {stdout}"
        );
        assert!(
            stdout.contains("number of transactions actually processed: 200/200"),
            "-M {mode}: {stdout}"
        );
    }
    let admin = Cluster::shared().admin(&db).await;
    let history: i64 = admin
        .query_one("SELECT count(*) FROM pgbench_history", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(history, 600, "every transaction wrote its history row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_with_a_stale_epoch_fails_every_transaction_with_pf001() {
    let (db, proxy) = pgbench_setup(5).await;
    for mode in ["simple", "extended", "prepared"] {
        let out = pgbench(
            proxy.port(),
            &db,
            4,
            &["-M", mode, "-c", "4", "-j", "2", "-t", "50", "-n"],
        )
        .await;
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(!out.status.success(), "-M {mode}: a stale run must fail: {stdout}");
        assert!(
            stderr.contains("ERROR:  pgfence: epoch 4 is stale for fence \"bench\" (current epoch 5)"),
            "-M {mode}: {stderr}"
        );
        // pgbench aborts a client on a non-retryable error: no transaction got through.
        assert!(
            stdout.contains("number of transactions actually processed: 0/200"),
            "-M {mode}: {stdout}"
        );
    }
    let admin = Cluster::shared().admin(&db).await;
    let history: i64 = admin
        .query_one("SELECT count(*) FROM pgbench_history", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(history, 0, "a stale pgbench run must leave nothing behind");
}

/// A CancelRequest packet for (pid, secret).
fn cancel_packet(pid: i32, secret: i32) -> Vec<u8> {
    let mut p = 16u32.to_be_bytes().to_vec();
    p.extend(80_877_102u32.to_be_bytes());
    p.extend(pid.to_be_bytes());
    p.extend(secret.to_be_bytes());
    p
}

/// Drivers report BackendKeyData's pid as the backend pid (psycopg `info.backend_pid`, asyncpg
/// `get_server_pid()`, node-pg `processID`) and applications match it against
/// `pg_backend_pid()` and NOTIFY sender pids, so the pid must be the upstream's; the secret
/// stays pgfence's, so the client's key cancels nothing when sent to Postgres directly.
/// Only a packet of exactly the key's length cancels.
#[tokio::test]
async fn backend_key_data_carries_the_upstream_pid_and_a_private_secret() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let proxy = Proxy::start(cluster.port(), "").await;
    let (mut raw, msgs) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    let key = msgs.iter().find(|m| m.tag == b'K').expect("BackendKeyData");
    let pid = i32::from_be_bytes(key.body[0..4].try_into().unwrap());
    let secret = i32::from_be_bytes(key.body[4..8].try_into().unwrap());
    let rows = raw.simple("SELECT pg_backend_pid()").await;
    let row = rows.iter().find(|m| m.tag == b'D').expect("a row");
    // DataRow: column count (2), length (4), text.
    assert_eq!(String::from_utf8_lossy(&row.body[6..]), pid.to_string());

    // The client's key sent straight to Postgres matches nothing there.
    raw.send(&query("SELECT pg_sleep(1)")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut direct = Raw::connect(cluster.port()).await;
    direct.send(&cancel_packet(pid, secret)).await;
    let reply = raw.read_until(|m| m.tag == b'Z').await;
    assert!(
        codes(&reply).is_empty(),
        "cancelled with the client's key sent to Postgres: {reply:?}"
    );

    // Through pgfence, the key with bytes after it is no CancelRequest, as in Postgres 15.
    raw.send(&query("SELECT pg_sleep(1)")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut longer = Raw::connect(proxy.port()).await;
    let mut packet = cancel_packet(pid, secret);
    packet[0..4].copy_from_slice(&20u32.to_be_bytes());
    packet.extend(0i32.to_be_bytes());
    longer.send(&packet).await;
    let reply = raw.read_until(|m| m.tag == b'Z').await;
    assert!(
        codes(&reply).is_empty(),
        "cancelled by a longer packet that starts with the key: {reply:?}"
    );

    // Through pgfence it cancels.
    raw.send(&query("SELECT pg_sleep(30)")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut via_proxy = Raw::connect(proxy.port()).await;
    via_proxy.send(&cancel_packet(pid, secret)).await;
    let reply = raw.read_until(|m| m.tag == b'Z').await;
    assert_eq!(codes(&reply), ["57014"], "{reply:?}");
}

/// Hand-made extended-protocol messages in the shapes pgjdbc sends, down to the reply tags
/// (the driver itself runs in `jdbc_driver_checks_pass_through_pgfence`).
mod jdbc_shape {
    use crate::common::raw::message;
    pub use crate::common::raw::{bind, execute, parse, sync};

    pub fn describe_portal(portal: &str) -> Vec<u8> {
        let mut b = vec![b'P'];
        b.extend(portal.as_bytes());
        b.push(0);
        message(b'D', &b)
    }

    /// pgjdbc with autocommit off: the first statement of a transaction is sent together with a
    /// one-shot BEGIN, no Sync in between; the statement gets a Describe of its portal.
    pub fn begin_then_write(sql: &str, params: &[&str]) -> Vec<u8> {
        [
            parse("", "BEGIN"),
            bind("", "", &[]),
            execute(""),
            parse("", sql),
            bind("", "", params),
            describe_portal(""),
            execute(""),
            sync(),
        ]
        .concat()
    }

    /// pgjdbc's executeBatch on a named (server-prepared) statement: one Parse, then Bind/Execute
    /// per row and one Sync.
    pub fn batch(name: &str, sql: &str, rows: &[&[&str]]) -> Vec<u8> {
        let mut out = parse(name, sql);
        for row in rows {
            out.extend(bind("", name, row));
            out.extend(describe_portal(""));
            out.extend(execute(""));
        }
        out.extend(sync());
        out
    }
}

/// The reply tags of a JDBC-shaped exchange through pgfence equal those of a direct connection
/// when the epoch is current, and a stale epoch fails the write the way a Postgres error would.
#[tokio::test]
async fn jdbc_shaped_transaction_and_batch_answer_like_postgres() {
    use jdbc_shape::*;
    let f = Fixture::new().await;
    let e = f.takeover("jdbc").await.to_string();
    let update = "UPDATE sweep_state SET note = $1 WHERE id = 1";
    let insert = "INSERT INTO sweep_state (id, note) VALUES ($1::int, $2)";
    let params = |port, epoch: &str| {
        let mut p = vec![
            ("user", "postgres".to_owned()),
            ("database", f.db.clone()),
            ("client_encoding", "UTF8".to_owned()),
            ("DateStyle", "ISO".to_owned()),
            ("extra_float_digits", "2".to_owned()),
        ];
        if port != f.cluster.port() {
            p.push(("options", format!("-c pgfence.epoch={epoch}")));
        }
        p
    };
    let mut replies = Vec::new();
    for (port, base) in [(f.cluster.port(), 100), (f.proxy.port(), 200)] {
        let p = params(port, &e);
        let p: Vec<(&str, &str)> = p.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (mut raw, _) = Raw::startup(port, &p).await;
        raw.send(&begin_then_write(update, &["jdbc"])).await;
        let mut tags = crate::common::raw::tags(&raw.read_until(|m| m.tag == b'Z').await);
        tags += &crate::common::raw::tags(&raw.simple("COMMIT").await);
        let (a, b) = ((base + 1).to_string(), (base + 2).to_string());
        raw.send(&batch("S_1", insert, &[&[&a, "b1"], &[&b, "b2"]])).await;
        tags += &crate::common::raw::tags(&raw.read_until(|m| m.tag == b'Z').await);
        replies.push(tags);
    }
    assert_eq!(replies[0], "12C12nCZCZ12nC2nCZ", "direct");
    assert_eq!(replies[1], replies[0], "through pgfence");

    // A stale leader: BEGIN runs, the write fails with PF001, COMMIT rolls back.
    f.takeover("jdbc-2").await;
    let p = params(f.proxy.port(), &e);
    let p: Vec<(&str, &str)> = p.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (mut raw, _) = Raw::startup(f.proxy.port(), &p).await;
    raw.send(&begin_then_write(update, &["stale"])).await;
    let msgs = raw.read_until(|m| m.tag == b'Z').await;
    assert_eq!(crate::common::raw::tags(&msgs), "12C12nEZ", "{msgs:?}");
    assert_eq!(codes(&msgs), ["PF001"]);
    assert_eq!(msgs.last().unwrap().body, b"E", "the transaction is aborted");
    let msgs = raw.simple("COMMIT").await;
    assert!(
        msgs.iter().any(|m| m.tag == b'C' && m.body.starts_with(b"ROLLBACK")),
        "{msgs:?}"
    );
    raw.send(&batch("S_2", insert, &[&["300", "s1"], &["301", "s2"]])).await;
    let msgs = raw.read_until(|m| m.tag == b'Z').await;
    assert_eq!(crate::common::raw::tags(&msgs), "12nEZ", "{msgs:?}");
    assert_eq!(codes(&msgs), ["PF001"]);
    assert_eq!(crate::common::raw::tags(&raw.simple("SELECT 1").await), "TDCZ");
    assert_eq!(f.note().await.0, "jdbc");
    let n: i64 = f
        .admin
        .query_one("SELECT count(*) FROM sweep_state WHERE id >= 300", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

/// libpq 18 with `max_protocol_version=latest` (psycopg's bundled libpq) asks for protocol 3.2;
/// pgfence offers 3.0 with NegotiateProtocolVersion, whose version field must be the whole
/// number 0x00030000 as Postgres sends it: libpq refuses a bare 0 as a "downgrade to pre-3.0".
#[tokio::test]
async fn protocol_3_2_startup_is_negotiated_down_to_3_0_as_postgres_does() {
    let f = Fixture::new().await;
    let mut replies = Vec::new();
    for port in [f.cluster.port(), f.proxy.port()] {
        let mut packet = crate::common::raw::startup_packet(&[
            ("user", "postgres"),
            ("database", &f.db),
            ("_pq_.pgfence_test", "1"),
        ]);
        packet[4..8].copy_from_slice(&0x0003_0002u32.to_be_bytes());
        let mut raw = Raw::connect(port).await;
        raw.send(&packet).await;
        let msgs = raw.read_until(|m| m.tag == b'Z' || m.tag == b'E').await;
        let v = msgs.iter().find(|m| m.tag == b'v').expect("NegotiateProtocolVersion");
        replies.push(v.body.clone());
        assert_eq!(msgs.last().map(|m| m.tag), Some(b'Z'), "{msgs:?}");
        assert_eq!(crate::common::raw::tags(&raw.simple("SELECT 1").await), "TDCZ");
    }
    assert_eq!(&replies[0][..4], &0x0003_0000u32.to_be_bytes(), "what Postgres sends");
    assert_eq!(replies[1], replies[0], "pgfence answers the same");
}
