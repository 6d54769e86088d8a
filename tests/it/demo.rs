//! `pgfence demo` as a user runs it: a subprocess whose output tells the story, checked for the
//! fenced run's PF001 rejection and the control's corruption, and for its cleanup.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The contract says "well under a minute"; this is the hard stop for a hung demo.
const DEMO_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `pgfence demo` with `env` added, killing it after [`DEMO_TIMEOUT`].
fn run_demo(env: &[(&str, &str)]) -> (Output, Duration) {
    let dir = crate::common::ScratchDir::new("pgfence-demo-test");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let started = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgfence"));
    cmd.arg("demo")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let mut child = cmd.spawn().expect("spawn pgfence demo");
    let status = wait_for(&mut child, started, &out);
    let output = Output {
        status,
        stdout: read(&out).into_bytes(),
        stderr: read(&err).into_bytes(),
    };
    (output, started.elapsed())
}

/// Waits for the demo `child`, killing it [`DEMO_TIMEOUT`] after `since`; `out` holds its
/// stdout, shown if it hangs.
fn wait_for(child: &mut std::process::Child, since: Instant, out: &Path) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if since.elapsed() > DEMO_TIMEOUT {
            let _ = child.kill();
            panic!("pgfence demo still running after {DEMO_TIMEOUT:?}:\n{}", read(out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn demo_shows_the_stale_write_rejected_with_pf001_and_the_control_corrupted() {
    let (output, took) = run_demo(&[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!("--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(output.status.success(), "demo failed ({}):\n{context}", output.status);
    assert!(took < Duration::from_secs(60), "the demo took {took:?}:\n{context}");

    // The fenced run: node-b takes over with epoch 2, node-a's write at epoch 1 is refused.
    assert!(stdout.contains("node-b  acquired the lease: epoch 2"), "{context}");
    assert!(
        stdout.contains("UPDATE sweep_state at epoch 1: REJECTED, SQLSTATE PF001"),
        "{context}"
    );
    assert!(
        stdout.contains("ERROR:  pgfence: epoch 1 is stale for fence \"invoice-sweeper\" (current epoch 2)"),
        "{context}"
    );
    assert!(
        stdout.contains("with pgfence:    node-a's stale write was REJECTED with PF001"),
        "{context}"
    );
    // The control: the same write without pgfence lands on top of node-b's.
    assert!(stdout.contains("without pgfence: CORRUPTED"), "{context}");
    assert!(
        stdout.contains(" 1 | swept by node-b at epoch 2   | 2"),
        "final fenced table:\n{context}"
    );
    assert!(
        stdout.contains(" 1 | swept by node-a at epoch 1   | 1"),
        "final control table:\n{context}"
    );

    // Cleanup: the temp dir it names is gone.
    let line = stdout
        .lines()
        .find(|l| l.starts_with("cleaned up:"))
        .unwrap_or_else(|| panic!("{context}"));
    let dir = line.rsplit(' ').next().unwrap();
    assert!(
        dir.starts_with('/') && !Path::new(dir).exists(),
        "{dir} should be removed:\n{context}"
    );
}

#[test]
fn demo_without_server_binaries_says_how_to_get_them() {
    let (output, _) = run_demo(&[("PG_BIN", "/nonexistent/pgfence-test/bin")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "must fail without binaries");
    assert!(
        stderr.contains("apt-get install postgresql") && stderr.contains("PG_BIN"),
        "{stderr}"
    );
}

/// The live processes whose command line holds `marker`, with it.
fn processes_with(marker: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let args = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args = String::from_utf8_lossy(&args).replace('\0', " ");
        let stat = read(&entry.path().join("stat"));
        let state = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .next();
        if args.contains(marker) && !matches!(state, Some("Z" | "X") | None) {
            found.push((pid, args));
        }
    }
    found
}

/// A Ctrl-C while Postgres is still starting stops it too: the demo exits at once, and
/// nothing of its server is left running or on disk. The server's first process is caught
/// as it appears and stopped (SIGSTOP), so the interrupt always lands before it is ready.
#[test]
fn an_interrupt_while_postgres_starts_leaves_nothing_behind() {
    let dir = crate::common::ScratchDir::new("pgfence-demo-int");
    let out = dir.join("stdout");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .arg("demo")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("spawn pgfence demo");
    let marker = format!("pgfence-demo-{}-", child.id());
    let started = Instant::now();
    // `runuser … /…/postgres -D …` as root, `/…/postgres -D …` otherwise (not the watchdog).
    let server = loop {
        let procs = processes_with(&marker);
        if let Some((pid, _)) = procs
            .iter()
            .find(|(_, args)| args.contains("/postgres -D") && !args.starts_with("sh "))
        {
            break *pid;
        }
        if started.elapsed() > DEMO_TIMEOUT {
            let _ = child.kill();
            panic!("no server process appeared:\n{}", read(&out));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let signal = |sig: &str, pid: u32| {
        Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
    };
    signal("-STOP", server);
    signal("-INT", child.id());
    let interrupted = Instant::now();
    let status = wait_for(&mut child, interrupted, &out);
    assert!(!status.success(), "{}", read(&out));
    // Its own shutdown, not the kill after a stop that does not come (10 s).
    let took = interrupted.elapsed();
    assert!(took < Duration::from_secs(8), "the interrupt took {took:?}");
    let left = processes_with(&marker);
    assert!(left.is_empty(), "left running: {left:?}");
    let dirs: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&marker))
        .collect();
    assert!(dirs.is_empty(), "left on disk: {dirs:?}");
    assert!(
        read(&out).contains("stopped: Postgres and its temp dir are gone"),
        "{}",
        read(&out)
    );
}
