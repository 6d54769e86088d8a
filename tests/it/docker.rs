//! What can be checked of `docker/` without a Docker engine: the config passes `check-config`,
//! the init SQL and the config install on a real Postgres, the compose file parses with the
//! expected services and ports, and the Dockerfile has the promised shape.

use std::path::{Path, PathBuf};
use std::process::Command;

use pgfence::config::RawConfig;
use pgfence::fence::install::{FenceStatus, LeaseStatus, install};

use crate::common::pg::{Cluster, connect};

fn docker_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docker").join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(docker_file(name)).unwrap_or_else(|e| panic!("docker/{name}: {e}"))
}

#[test]
fn docker_config_passes_check_config() {
    let output = Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .args(["check-config", "--config"])
        .arg(docker_file("pgfence.toml"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("listen 0.0.0.0:6432, upstream postgres:5432, 1 fence(s)"),
        "{text}"
    );
}

#[tokio::test]
async fn docker_schema_and_config_install_with_the_lease_trigger() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut client = connect(cluster.port(), &db, "").await;
    client
        .batch_execute(&read("initdb/01-schema.sql"))
        .await
        .expect("docker/initdb/01-schema.sql runs");
    let config = RawConfig::from_file(&docker_file("pgfence.toml"))
        .unwrap()
        .validate()
        .unwrap();
    let report = install(&mut client, &config.fences)
        .await
        .expect("pgfence init --config docker/pgfence.toml");
    match &report.fences[0].status {
        FenceStatus::Registered {
            missing_tables,
            lease: LeaseStatus::Installed { .. },
            ..
        } => {
            assert!(missing_tables.is_empty(), "{report}");
        }
        other => panic!("fence not registered with its lease: {other:?}"),
    }
}

/// `name|image|ports|entrypoint` per service, from PyYAML (`None` when python3 or PyYAML is
/// missing: there is no YAML parser among the crate's dependencies, and one is not worth adding
/// for a test).
fn compose_services() -> Option<Vec<String>> {
    const SCRIPT: &str = "import sys, yaml\n\
        doc = yaml.safe_load(open(sys.argv[1]))\n\
        for name, s in doc['services'].items():\n\
        \x20   print('|'.join([name, s.get('image', ''), ','.join(map(str, s.get('ports', []))),\n\
        \x20                   ' '.join(s.get('entrypoint', []))]))\n";
    let output = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(docker_file("compose.yaml"))
        .output()
        .ok()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("No module named 'yaml'") {
        return None;
    }
    assert!(output.status.success(), "compose.yaml does not parse: {stderr}");
    Some(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_owned)
            .collect(),
    )
}

#[test]
fn compose_file_runs_postgres_pgfence_and_two_sweepers() {
    let Some(services) = compose_services() else {
        eprintln!("skipped: python3 with PyYAML is needed to parse docker/compose.yaml");
        return;
    };
    let expected = [
        "postgres|postgres:15||",
        "pgfence-init|pgfence:local||",
        "pgfence|pgfence:local|6432:6432|",
        "sweeper-a|pgfence:local||invoice_sweeper",
        "sweeper-b|pgfence:local||invoice_sweeper",
    ];
    assert_eq!(services, expected);
    let compose = read("compose.yaml");
    for mounted in [
        "./initdb:/docker-entrypoint-initdb.d",
        "./pgfence.toml:/etc/pgfence/pgfence.toml",
    ] {
        assert!(compose.contains(mounted), "compose.yaml mounts {mounted}");
    }
    assert!(compose.contains("PGFENCE_URL: postgres://app:app@pgfence:6432/app"));
}

#[test]
fn dockerfile_builds_in_rust_and_runs_slim_as_non_root() {
    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    assert!(has("FROM rust:1-bookworm AS build"));
    assert!(has("FROM debian:bookworm-slim"));
    assert!(has("USER pgfence"));
    assert!(has("EXPOSE 6432"));
    assert!(has("ENTRYPOINT [\"pgfence\"]"));
    assert!(has("CMD [\"serve\", \"--config\", \"/etc/pgfence/pgfence.toml\"]"));
    assert!(
        dockerfile.contains("--example invoice_sweeper"),
        "the compose sweepers run the example"
    );
    // The runtime stage (after the last FROM) runs as a non-root user.
    let runtime = dockerfile.rsplit("FROM ").next().unwrap();
    assert!(runtime.contains("useradd") && runtime.contains("USER pgfence"));
}
