//! Real tools through pgfence: psql and pgbench.

use std::process::Command;

use crate::common::inproc::Proxy;
use crate::common::pg::Cluster;

/// Runs a blocking command off the runtime, so the in-process proxy keeps serving.
async fn run(mut cmd: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("run command"))
        .await
        .unwrap()
}

async fn psql(port: u16, db: &str, script: &str) -> (String, String, bool) {
    let mut cmd = Command::new("psql");
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
        "-v",
        "ON_ERROR_STOP=0",
    ])
    .arg("-c")
    .arg(script)
    .env("PGCONNECT_TIMEOUT", "10");
    let out = run(cmd).await;
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

async fn psql_file(port: u16, db: &str, file: &std::path::Path) -> (String, String) {
    let mut cmd = Command::new("psql");
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
        "-f",
    ])
    .arg(file);
    let out = run(cmd).await;
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_script_output_is_the_same_through_pgfence() {
    let cluster = Cluster::shared();
    let proxy = Proxy::start(cluster.port(), "").await;
    let dir = crate::common::unique_temp_dir("psql");
    let data = dir.join("rows.csv");
    std::fs::write(&data, "1,one\n2,two\n3,three\n").unwrap();
    let script = dir.join("script.sql");
    std::fs::write(
        &script,
        format!(
            "CREATE TABLE t (id int PRIMARY KEY, name text);\n\\copy t FROM '{}' WITH (FORMAT csv)\n\
             SELECT * FROM t ORDER BY id;\nINSERT INTO t VALUES (1, 'dup');\nSELECT count(*) FROM t; SELECT 'x' AS y;\n\
             BEGIN;\nSELECT 1/0;\nROLLBACK;\n\\copy (SELECT * FROM t ORDER BY id) TO STDOUT\nNOTIFY ch, 'p';\n",
            data.display()
        ),
    )
    .unwrap();
    let mut outputs = Vec::new();
    for port in [cluster.port(), proxy.port()] {
        let db = cluster.fresh_db().await;
        let (out, err) = psql_file(port, &db, &script).await;
        outputs.push((out, err.replace(&db, "DB")));
    }
    assert!(outputs[0].0.contains("three"), "{outputs:?}");
    assert!(outputs[0].1.contains("duplicate key"), "{outputs:?}");
    assert_eq!(outputs[0], outputs[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_connects_with_default_sslmode_prefer() {
    let cluster = Cluster::shared();
    let proxy = Proxy::start(cluster.port(), "").await;
    let db = cluster.fresh_db().await;
    let (out, err, ok) = psql(proxy.port(), &db, "SELECT 40 + 2 AS answer").await;
    assert!(ok, "{err}");
    assert!(out.contains("42"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_runs_every_mode_through_pgfence() {
    let cluster = Cluster::shared();
    let proxy = Proxy::start(cluster.port(), "").await;
    let db = cluster.fresh_db().await;
    let pgbench = cluster.bin("pgbench");
    let port = proxy.port().to_string();
    let base = ["-h", "127.0.0.1", "-p", port.as_str(), "-U", "postgres"];
    let mut init = Command::new(&pgbench);
    init.args(base).args(["-i", "-s", "1", "-q"]).arg(&db);
    let init = run(init).await;
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    for mode in ["simple", "extended", "prepared"] {
        for select_only in [true, false] {
            let mut cmd = Command::new(&pgbench);
            cmd.args(base)
                .args(["-M", mode, "-c", "4", "-j", "2", "-t", "50", "-n"]);
            if select_only {
                cmd.arg("-S");
            }
            cmd.arg(&db);
            let out = run(cmd).await;
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{mode} -S={select_only}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.contains("number of failed transactions: 0"), "{stdout}");
            assert!(
                stdout.contains("number of transactions actually processed: 200/200"),
                "{stdout}"
            );
        }
    }
}
