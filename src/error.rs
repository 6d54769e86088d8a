//! Errors pgfence raises itself, with their SQLSTATEs.
//!
//! Errors that come from Postgres are forwarded byte for byte and never pass
//! through here. Each [`ProxyError`] variant maps to exactly one SQLSTATE and
//! severity; [`ProxyError::to_response`] is the only way one reaches a client,
//! so internals (addresses, source chains) never leak into a message.

use bytes::BytesMut;

use crate::protocol::codec;

/// SQLSTATE codes pgfence uses, in one place.
pub mod sqlstate {
    /// Stale epoch.
    pub const STALE_EPOCH: &str = "PF001";
    /// Fenced write without a declared epoch.
    pub const NO_EPOCH: &str = "PF002";
    /// Invalid epoch, or above the lease's.
    pub const INVALID_EPOCH: &str = "PF003";
    /// Statement could not be analysed and may write a fenced table.
    pub const UNANALYSABLE: &str = "PF004";
    /// The database has no `pgfence` schema.
    pub const NOT_INITIALISED: &str = "PF005";
    /// protocol_violation.
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    /// connection_failure: the upstream went away.
    pub const CONNECTION_FAILURE: &str = "08006";
    /// sqlclient_unable_to_establish_sqlconnection: the upstream cannot be reached.
    pub const CANNOT_CONNECT: &str = "08001";
    /// too_many_connections.
    pub const TOO_MANY_CONNECTIONS: &str = "53300";
    /// insufficient_resources: pgfence is out of file descriptors.
    pub const INSUFFICIENT_RESOURCES: &str = "53000";
    /// admin_shutdown.
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    /// feature_not_supported.
    pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
}

/// Message severity, as Postgres spells it in the `S`/`V` fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The statement failed; the session goes on.
    Error,
    /// The session ends.
    Fatal,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "ERROR",
            Severity::Fatal => "FATAL",
        }
    }
}

/// An error pgfence itself reports to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// A message broke the protocol: malformed, truncated or too long.
    #[error("pgfence: invalid frontend message: {0}")]
    Protocol(String),
    /// The upstream refused or could not be reached.
    #[error("pgfence: cannot connect to upstream server: {0}")]
    UpstreamUnreachable(String),
    /// The upstream connection was lost mid-session.
    #[error("pgfence: lost the connection to the upstream server")]
    UpstreamLost,
    /// The connection limit is reached.
    #[error("pgfence: sorry, too many clients already")]
    TooManyConnections,
    /// No file descriptor was left for the connection to the upstream.
    #[error("pgfence: out of file descriptors: cannot open a connection to the upstream server")]
    OutOfFiles,
    /// pgfence is shutting down.
    #[error("pgfence: terminating connection due to administrator command")]
    Shutdown,
    /// An epoch declared in the startup packet is not valid.
    #[error("pgfence: invalid value for {0}")]
    InvalidStartupEpoch(String),
    /// A request pgfence does not serve (e.g. replication connections).
    #[error("pgfence: {0}")]
    Unsupported(String),
}

impl ProxyError {
    /// The SQLSTATE and severity; exhaustive on purpose.
    pub fn code(&self) -> (&'static str, Severity) {
        match self {
            ProxyError::Protocol(_) => (sqlstate::PROTOCOL_VIOLATION, Severity::Fatal),
            ProxyError::UpstreamUnreachable(_) => (sqlstate::CANNOT_CONNECT, Severity::Fatal),
            ProxyError::UpstreamLost => (sqlstate::CONNECTION_FAILURE, Severity::Fatal),
            ProxyError::TooManyConnections => (sqlstate::TOO_MANY_CONNECTIONS, Severity::Fatal),
            ProxyError::OutOfFiles => (sqlstate::INSUFFICIENT_RESOURCES, Severity::Fatal),
            ProxyError::Shutdown => (sqlstate::ADMIN_SHUTDOWN, Severity::Fatal),
            ProxyError::InvalidStartupEpoch(_) => (sqlstate::INVALID_EPOCH, Severity::Fatal),
            ProxyError::Unsupported(_) => (sqlstate::FEATURE_NOT_SUPPORTED, Severity::Fatal),
        }
    }

    /// The HINT the error carries, if any.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            ProxyError::InvalidStartupEpoch(_) => {
                Some("pgfence.epoch must be an integer between 1 and 9223372036854775807.")
            }
            ProxyError::UpstreamUnreachable(_) => {
                Some("Check that the upstream Postgres in pgfence's config is running.")
            }
            ProxyError::OutOfFiles => {
                Some("Raise pgfence's open-file limit (ulimit -n, LimitNOFILE=), or lower max_client_conn.")
            }
            ProxyError::Protocol(_)
            | ProxyError::UpstreamLost
            | ProxyError::TooManyConnections
            | ProxyError::Shutdown
            | ProxyError::Unsupported(_) => None,
        }
    }

    /// The ErrorResponse a client receives.
    pub fn to_response(&self) -> BytesMut {
        let (code, severity) = self.code();
        let mut out = BytesMut::new();
        codec::error_response(&mut out, severity.as_str(), code, &self.to_string(), self.hint());
        out
    }
}

/// Whether `e` says the process (EMFILE) or the system (ENFILE) is out of file descriptors.
pub fn out_of_files(e: &std::io::Error) -> bool {
    [rustix::io::Errno::MFILE, rustix::io::Errno::NFILE]
        .iter()
        .any(|errno| e.raw_os_error() == Some(errno.raw_os_error()))
}

/// The error for a failed connection to the upstream: out of file descriptors is pgfence's
/// own limit, not the upstream's absence, and says so.
pub fn upstream_connect_error(e: &std::io::Error) -> ProxyError {
    if out_of_files(e) {
        ProxyError::OutOfFiles
    } else {
        // The error itself, not its kind: "uncategorized error" says nothing of an unknown
        // host name.
        ProxyError::UpstreamUnreachable(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_files_is_told_apart_from_an_unreachable_upstream() {
        let emfile = std::io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        let err = upstream_connect_error(&emfile);
        assert_eq!(err.code(), ("53000", Severity::Fatal));
        assert!(err.hint().unwrap().contains("open-file limit"));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let err = upstream_connect_error(&refused);
        assert_eq!(err.code(), ("08001", Severity::Fatal));
        assert!(err.to_string().contains("refused"), "{err}");
    }
}
