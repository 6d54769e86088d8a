//! Shared scaffolding for the single integration-test binary (`tests/it`).
//!
//! - [`pg`]: a throwaway PostgreSQL cluster per test binary and a fresh database per test.
//! - [`proxy`]: the `pgfence` binary run as a subprocess, for tests that need real signals,
//!   exit codes and log output.
//!
//! Not every test module uses every helper, and each test binary compiles this module once, so
//! unused helpers would otherwise trip `-D warnings`.
#![allow(
    dead_code,
    reason = "helpers are shared by test modules; not all are used by each one"
)]

pub mod inproc;
pub mod pg;
pub mod proxy;
pub mod raw;

use std::net::{Ipv4Addr, TcpListener};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// The port is released before it is returned, so another process could take it first; that race
/// is rare enough on a test machine and keeps servers (Postgres, the proxy) in charge of their own
/// sockets.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

/// Creates a new, empty directory under the system temp dir whose name no other test (or test
/// binary) uses: the process id, a per-process counter and the clock make it unique.
pub fn unique_temp_dir(prefix: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}-{nanos:x}", std::process::id()));
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// A [`unique_temp_dir`] that is removed, with everything in it, when dropped: scratch space for
/// one test's files (configs, scripts, captured output), left behind neither on success nor on a
/// failed assertion.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(prefix: &str) -> Self {
        Self(unique_temp_dir(prefix))
    }
}

impl Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
