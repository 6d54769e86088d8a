//! Real tools through pgfence: psql, pgbench, pg_dump and pg_restore.

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
    let dir = crate::common::ScratchDir::new("psql");
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

/// pg_dump's own output restored through pgfence into a database whose tables are
/// fenced: refused as a whole without an epoch (and `-1` leaves nothing behind), restored
/// whole with one, serial sequences' ownership and a publication included (pg_dump writes
/// `ALTER SEQUENCE … OWNED BY` and `ALTER PUBLICATION … ADD TABLE` for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_restore_of_a_dump_through_pgfence_needs_an_epoch_and_restores_whole() {
    let cluster = Cluster::shared();
    let source = cluster.fresh_db().await;
    cluster
        .admin(&source)
        .await
        .batch_execute(
            "CREATE TABLE ledger (id serial PRIMARY KEY, note text);
             CREATE TABLE accounts (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, owner text);
             INSERT INTO ledger (note) SELECT 'n' || g FROM generate_series(1, 50) g;
             INSERT INTO accounts (owner) VALUES ('a'), ('b');
             SET client_min_messages = error;
             CREATE PUBLICATION pub FOR TABLE ledger;",
        )
        .await
        .unwrap();
    let dir = crate::common::ScratchDir::new("pg-restore");
    let dump = dir.join("source.dump");
    let port = cluster.port().to_string();
    let mut cmd = Command::new(cluster.bin("pg_dump"));
    cmd.args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-Fc", "-f"])
        .arg(&dump)
        .arg(&source);
    let out = run(cmd).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let toml = "[[fence]]\nname = \"books\"\ntables = [\"public.ledger\", \"public.accounts\"]\n";
    let proxy = Proxy::start(cluster.port(), toml).await;
    let restore = |db: String, port: u16, options: &'static str| {
        let mut cmd = Command::new(cluster.bin("pg_restore"));
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-1", "-d"])
            .arg(&db)
            .arg(&dump)
            .env("PGOPTIONS", options);
        run(cmd)
    };
    let shape = "SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM accounts), \
                 pg_get_serial_sequence('public.ledger', 'id') IS NOT NULL, \
                 (SELECT count(*) FROM pg_publication_tables WHERE pubname = 'pub')";
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
    for port in [proxy.port(), cluster.port()] {
        let target = cluster.fresh_db().await;
        let mut admin = cluster.admin(&target).await;
        crate::fencing::install(&mut admin, cluster.port(), toml).await;
        if port == proxy.port() {
            let out = restore(target.clone(), port, "").await;
            assert!(!out.status.success());
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("without an epoch"),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let left: i64 = admin.query_one(tables, &[]).await.unwrap().get(0);
            assert_eq!(left, 0, "a refused restore leaves nothing behind");
        }
        let out = restore(target.clone(), port, "-c pgfence.epoch=1").await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let row = admin.query_one(shape, &[]).await.unwrap();
        let got: (i64, i64, bool, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
        assert_eq!(got, (50, 2, true, 1), "port {port}");
    }
}
