//! Configuration: a TOML file (unknown keys are an error) overlaid by command-line
//! flags, parsed once into a validated [`Config`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::sql::lex::MAX_IDENT_BYTES as MAX_NAME_BYTES;
use crate::sql::name::TableName;

/// Default address pgfence listens on.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:6432";
/// Default upstream Postgres.
pub const DEFAULT_UPSTREAM: &str = "127.0.0.1:5432";
/// Largest Query or Parse message pgfence reads whole (Postgres' own cap is 1 GiB;
/// anything bigger than this is refused with 08P01).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// The configuration file as written: every field documented here is the reference.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Address to listen on, `host:port`. Default `127.0.0.1:6432`.
    pub listen: Option<String>,
    /// The protected Postgres, `host:port`. Credentials come from clients. Default `127.0.0.1:5432`.
    pub upstream: Option<String>,
    /// Most client connections served at once; beyond it clients get FATAL 53300. Default 1000.
    pub max_client_conn: Option<usize>,
    /// Largest Query/Parse message in bytes (other messages stream). Default 64 MiB.
    pub max_message_size: Option<usize>,
    /// Seconds a SIGTERM waits for open transactions before closing them. Default 30.
    pub shutdown_grace: Option<f64>,
    /// Seconds to reach the upstream: its TCP connection, then its first answer to the
    /// startup packet (FATAL 08001 after); 0 means no limit. Default 5.
    pub connect_timeout: Option<f64>,
    /// Threads serving sessions: 1 (default) runs everything on one thread, like PgBouncer,
    /// which costs the least CPU per query; 0 means one per CPU, for more than one core of relaying.
    pub workers: Option<usize>,
    /// The database `pgfence init` installs into when `--database-url` is not given.
    pub database_url: Option<String>,
    /// The fences; a table belongs to at most one fence (per database).
    #[serde(default, rename = "fence")]
    pub fences: Vec<RawFence>,
}

/// One `[[fence]]` section.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFence {
    /// Fence name: one fence = one lease = one epoch sequence.
    pub name: String,
    /// Only this database; default: any database.
    pub database: Option<String>,
    /// Fenced tables, `schema.table` or `table` (meaning `public.table`).
    pub tables: Vec<String>,
    /// `"reject"` (default) or `"rewrite"`.
    #[serde(default)]
    pub mode: Mode,
    /// Column carrying each row's epoch; required for `mode = "rewrite"`.
    pub epoch_column: Option<String>,
    /// The lease table this fence's epochs come from.
    pub lease: Option<RawLease>,
}

/// `[fence.lease]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLease {
    /// A table of the seed's shape (`name`, `holder`, `epoch`, `expires_at`).
    pub table: String,
    /// Its `name` value; default: the fence's name.
    pub row: Option<String>,
}

/// How a fence enforces epochs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A guard checks the epoch against the fence's high-water mark; stale writes fail with PF001.
    #[default]
    Reject,
    /// Each row carries the epoch; stale writes touch 0 rows.
    Rewrite,
}

/// A validated fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Fence name.
    pub name: String,
    /// Only this database, or any.
    pub database: Option<String>,
    /// Normalised, schema-qualified table names: the ones configured, then
    /// [`Self::as_written`].
    pub tables: Vec<TableName>,
    /// Tables fenced too because a configured name has unquoted capitals: `Inv` names
    /// `public.inv`, as in SQL, and also `public."Inv"`, the table a user who copied a
    /// mixed-case name most likely meant. Fencing both fails closed; a warning says so.
    pub as_written: Vec<(String, TableName)>,
    /// Enforcement mode.
    pub mode: Mode,
    /// Epoch column (rewrite mode), normalised.
    pub epoch_column: Option<String>,
    /// Lease coupling.
    pub lease: Option<Lease>,
}

/// A validated lease reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lease table, schema-qualified.
    pub table: TableName,
    /// The lease row's `name`.
    pub row: String,
}

/// The validated configuration pgfence runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address.
    pub listen: String,
    /// Upstream `host:port`.
    pub upstream: String,
    /// Connection limit.
    pub max_client_conn: usize,
    /// Cap for Query/Parse messages.
    pub max_message_size: usize,
    /// Drain period on SIGTERM.
    pub shutdown_grace: Duration,
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
    /// Runtime threads (0 = one per CPU).
    pub workers: usize,
    /// Where `pgfence init` installs by default.
    pub database_url: Option<String>,
    /// Fences.
    pub fences: Vec<Fence>,
}

impl Config {
    /// Settings that are valid but probably not meant, one sentence each: the caller logs them.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .fences
            .iter()
            .filter(|f| f.mode == Mode::Reject && f.epoch_column.is_some())
            .map(|f| {
                format!(
                    "fence {:?}: epoch_column is read only with mode = \"rewrite\"; this reject-mode fence ignores it",
                    f.name
                )
            })
            .collect();
        for f in &self.fences {
            for (input, kept) in &f.as_written {
                let folded = TableName::parse_config(input)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                out.push(format!(
                    "fence {:?}: table name {input} has capitals without quotes, so it names {folded} as in SQL; \
                     pgfence fences {kept} too, as written: quote the name in the config (for example '{kept}') \
                     or write it in lower case to fence one table",
                    f.name
                ));
            }
        }
        // An unqualified name in SQL matches a fenced table of that name in any schema.
        for f in &self.fences {
            let Some(lease) = &f.lease else { continue };
            for g in self
                .fences
                .iter()
                .filter(|g| databases_overlap(g.database.as_deref(), f.database.as_deref()))
            {
                for t in g
                    .tables
                    .iter()
                    .filter(|t| t.name == lease.table.name && **t != lease.table)
                {
                    out.push(format!(
                        "fence {:?}: an unqualified {} in SQL also names the fenced table {t} (fence {:?}), so a \
                         lease update written that way through pgfence is refused: qualify it ({})",
                        f.name, lease.table.name, g.name, lease.table
                    ));
                }
            }
        }
        out
    }
}

/// A configuration problem, worded for the person who wrote the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {cause}")]
    Read {
        /// Path.
        path: String,
        /// Cause (in the message, so not also chained as the source).
        cause: std::io::Error,
    },
    /// TOML syntax or an unknown key.
    #[error("{path}: {message}")]
    Syntax {
        /// Path.
        path: String,
        /// What toml said.
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("{0}")]
    Invalid(String),
}

impl RawConfig {
    /// Reads and parses a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: display.clone(),
            cause,
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Syntax { message, .. } => ConfigError::Syntax { path: display, message },
            other => other,
        })
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: "config".into(),
            message: e.to_string(),
        })
    }

    /// Checks everything and produces the config pgfence runs with.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        let listen = self.listen.unwrap_or_else(|| DEFAULT_LISTEN.into());
        check_host_port("listen", &listen)?;
        let upstream = self.upstream.unwrap_or_else(|| DEFAULT_UPSTREAM.into());
        if check_host_port("upstream", &upstream)? == 0 {
            return Err(invalid(format!(
                "upstream = {upstream:?}: port 0 is not a port Postgres listens on"
            )));
        }
        if listen.eq_ignore_ascii_case(&upstream) {
            return Err(invalid(format!(
                "upstream = {upstream:?} is pgfence's own listen address: each session would connect to pgfence \
                 again until max_client_conn is used up; point upstream at Postgres"
            )));
        }
        let max_client_conn = self.max_client_conn.unwrap_or(1000);
        if max_client_conn == 0 {
            return Err(invalid("max_client_conn must be at least 1".into()));
        }
        let max_message_size = self.max_message_size.unwrap_or(DEFAULT_MAX_MESSAGE_SIZE);
        if !(1024..=1 << 30).contains(&max_message_size) {
            return Err(invalid(
                "max_message_size must be between 1024 and 1073741824 bytes".into(),
            ));
        }
        let shutdown_grace = seconds("shutdown_grace", self.shutdown_grace.unwrap_or(30.0))?;
        // 0 means no limit, as libpq's connect_timeout.
        let connect_timeout = match seconds("connect_timeout", self.connect_timeout.unwrap_or(5.0))? {
            Duration::ZERO => Duration::MAX,
            d => d,
        };
        let fences = self
            .fences
            .into_iter()
            .map(RawFence::validate)
            .collect::<Result<Vec<_>, _>>()?;
        check_fences(&fences)?;
        if let Some(url) = &self.database_url {
            // Checked here, not first by `init`: `check-config` is where a config is vetted.
            url.parse::<tokio_postgres::Config>()
                .map_err(|e| ConfigError::Invalid(format!("invalid database_url: {e}")))?;
        }
        let workers = self.workers.unwrap_or(1);
        if workers > 1024 {
            return Err(ConfigError::Invalid(
                "workers must be between 0 (one per CPU) and 1024".into(),
            ));
        }
        Ok(Config {
            listen,
            upstream,
            max_client_conn,
            max_message_size,
            shutdown_grace,
            connect_timeout,
            workers,
            database_url: self.database_url,
            fences,
        })
    }
}

impl RawFence {
    fn validate(self) -> Result<Fence, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(format!("fence {:?}: {m}", self.name));
        if self.name.is_empty() || self.name.chars().any(char::is_control) {
            return Err(invalid("name must be non-empty printable text".into()));
        }
        if self.tables.is_empty() {
            return Err(invalid("tables must list at least one table".into()));
        }
        if self.database.as_deref() == Some("") {
            // No session has an empty database name: such a fence would guard nothing.
            return Err(invalid(
                "database must name a database (leave it out to fence the tables in every database)".into(),
            ));
        }
        if self.database.as_ref().is_some_and(|d| d.len() > MAX_NAME_BYTES) {
            // Postgres cuts a longer name to 63 bytes: no session would carry this one.
            return Err(invalid(format!(
                "database is longer than {MAX_NAME_BYTES} bytes, the most a Postgres name holds"
            )));
        }
        let mut tables = self
            .tables
            .iter()
            .map(|t| TableName::parse_config(t).map_err(|e| invalid(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut as_written = Vec::new();
        for input in &self.tables {
            if let Some(t) = TableName::parse_config_as_written(input)
                && !tables.contains(&t)
            {
                tables.push(t.clone());
                as_written.push((input.clone(), t));
            }
        }
        let epoch_column = match (self.mode, &self.epoch_column) {
            (Mode::Rewrite, None) => return Err(invalid("mode = \"rewrite\" needs epoch_column".into())),
            (_, Some(c)) => Some(normalise_column(c).ok_or_else(|| invalid(format!("invalid epoch_column {c:?}")))?),
            (Mode::Reject, None) => None,
        };
        let lease = match &self.lease {
            None => None,
            Some(l) => Some(Lease {
                table: TableName::parse_config(&l.table).map_err(|e| invalid(format!("lease: {e}")))?,
                row: l.row.clone().unwrap_or_else(|| self.name.clone()),
            }),
        };
        if lease.as_ref().is_some_and(|l| l.row.is_empty()) {
            return Err(invalid(
                "lease: row must name the lease row (leave it out to use the fence's name)".into(),
            ));
        }
        Ok(Fence {
            name: self.name,
            database: self.database,
            tables,
            as_written,
            mode: self.mode,
            epoch_column,
            lease,
        })
    }
}

/// `last_epoch` and `Last_Epoch` fold to `last_epoch`; `"Last_Epoch"` keeps its case.
fn normalise_column(c: &str) -> Option<String> {
    let c = c.trim();
    if let Some(inner) = c.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        return (!inner.is_empty() && !inner.contains('"')).then(|| inner.to_owned());
    }
    let ok = !c.is_empty()
        && !c.starts_with(|ch: char| ch.is_ascii_digit())
        && c.chars().all(|ch| ch.is_alphanumeric() || ch == '_');
    // Postgres folds only ASCII letters of an unquoted name.
    ok.then(|| c.to_ascii_lowercase())
}

fn check_fences(fences: &[Fence]) -> Result<(), ConfigError> {
    let mut names = HashMap::new();
    let mut tables: HashMap<&TableName, Vec<(&str, Option<&str>)>> = HashMap::new();
    for f in fences {
        if names.insert(f.name.as_str(), ()).is_some() {
            return Err(ConfigError::Invalid(format!("fence {:?} is defined twice", f.name)));
        }
        for t in &f.tables {
            let owners = tables.entry(t).or_default();
            // Fence identity is (database, table): two fences may share a table
            // name only when they are restricted to different databases.
            if owners.iter().any(|(owner, _)| *owner == f.name) {
                return Err(ConfigError::Invalid(format!(
                    "fence {:?} lists table {t} twice",
                    f.name
                )));
            }
            for (other, db) in owners.iter() {
                if databases_overlap(*db, f.database.as_deref()) {
                    return Err(ConfigError::Invalid(format!(
                        "table {t} belongs to fence {other:?} and fence {:?}; a table belongs to at most one fence",
                        f.name
                    )));
                }
            }
            owners.push((&f.name, f.database.as_deref()));
        }
    }
    // Taking or renewing a lease must not itself need an epoch: a fenced lease table
    // would refuse every acquisition (PF002, then PF003), and nobody could lead again.
    for f in fences {
        let Some(lease) = &f.lease else { continue };
        for (owner, db) in tables.get(&lease.table).into_iter().flatten() {
            if databases_overlap(*db, f.database.as_deref()) {
                return Err(ConfigError::Invalid(format!(
                    "fence {:?}: lease table {} is also a fenced table (of fence {owner:?}); \
                     taking the lease would need an epoch, so nobody could ever lead: \
                     remove it from tables",
                    f.name, lease.table
                )));
            }
        }
    }
    Ok(())
}

/// Whether two fences' `database` settings can apply to the same database (unset: any).
fn databases_overlap(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// The address of `upstream` (resolved) that reaches pgfence itself at `listen` (resolved,
/// or bound): the same port at the same address, or at any address of this host when
/// pgfence listens on all of them. A config that spells the two differently
/// (`localhost` and `127.0.0.1`, `0.0.0.0` and `127.0.0.1`, `::ffff:127.0.0.1` and
/// `127.0.0.1`) would still make each session connect to pgfence again.
pub fn upstream_reaches_listen(listen: &[SocketAddr], upstream: &[SocketAddr]) -> Option<SocketAddr> {
    upstream.iter().copied().find(|u| {
        // Where a connect to `u` arrives: a v4-mapped address is the IPv4 one, and an
        // unspecified one is this host's loopback.
        let ip = match u.ip().to_canonical() {
            IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        // An address of this host (bound with its scope, which a link-local one needs).
        let local = || {
            let probe = match u {
                SocketAddr::V6(a) if ip.is_ipv6() => SocketAddr::V6(SocketAddrV6::new(ip_v6(ip), 0, 0, a.scope_id())),
                _ => SocketAddr::new(ip, 0),
            };
            ip.is_loopback() || TcpListener::bind(probe).is_ok()
        };
        listen.iter().any(|l| {
            let at = l.ip().to_canonical();
            l.port() == u.port()
                && (at == ip
                    // `::` takes IPv4 connections too (unless bindv6only is set).
                    || at.is_unspecified() && (at.is_ipv6() || ip.is_ipv4()) && local())
        })
    })
}

/// The IPv6 address of `ip` (mapped when it is IPv4).
fn ip_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// [`upstream_reaches_listen`]'s refusal.
pub fn upstream_is_listen(upstream: &str, addr: SocketAddr) -> String {
    format!(
        "upstream = {upstream:?} ({addr}) is pgfence's own listen address: each session would connect to \
         pgfence again until max_client_conn is used up; point upstream at Postgres"
    )
}

/// Checks `host:port` and returns the port.
fn check_host_port(field: &str, value: &str) -> Result<u16, ConfigError> {
    value
        .rsplit_once(':')
        .filter(|(host, _)| !host.is_empty())
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .ok_or_else(|| ConfigError::Invalid(format!("{field} = {value:?}: expected host:port, e.g. 127.0.0.1:6432")))
}

fn seconds(field: &str, value: f64) -> Result<Duration, ConfigError> {
    if value.is_finite() && (0.0..=86_400.0).contains(&value) {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(ConfigError::Invalid(format!(
            "{field} must be a number of seconds between 0 and 86400"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_that_reaches_pgfence_itself_is_found_by_address() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        let reaches = |l: &str, u: &str| upstream_reaches_listen(&[addr(l)], &[addr(u)]).is_some();
        assert!(reaches("127.0.0.1:6432", "127.0.0.1:6432"));
        assert!(reaches("0.0.0.0:6432", "127.0.0.1:6432"));
        assert!(reaches("127.0.0.1:6432", "0.0.0.0:6432"));
        assert!(reaches("[::]:6432", "127.0.0.1:6432"));
        assert!(reaches("[::]:6432", "[::1]:6432"));
        assert!(reaches("[::1]:6432", "[::1]:6432"));
        assert!(!reaches("127.0.0.1:6432", "127.0.0.1:5432"), "another port");
        assert!(!reaches("127.0.0.2:6432", "127.0.0.1:6432"), "another loopback address");
        assert!(!reaches("0.0.0.0:6432", "[::1]:6432"), "0.0.0.0 takes no IPv6");
        assert!(!reaches("0.0.0.0:6432", "192.0.2.1:6432"), "an address of another host");
        // A v4-mapped address is the IPv4 one, either side.
        assert!(reaches("127.0.0.1:6432", "[::ffff:127.0.0.1]:6432"));
        assert!(reaches("[::ffff:127.0.0.1]:6432", "127.0.0.1:6432"));
        assert!(reaches("0.0.0.0:6432", "[::ffff:127.0.0.1]:6432"));
        // An unspecified upstream is the loopback address of its family, and only that.
        assert!(reaches("[::1]:6432", "[::]:6432"));
        assert!(
            !reaches("127.0.0.2:6432", "0.0.0.0:6432"),
            "0.0.0.0 reaches 127.0.0.1 only"
        );
        assert!(!reaches("[::1]:6432", "0.0.0.0:6432"));
        // Any of several resolved addresses.
        let found = upstream_reaches_listen(&[addr("127.0.0.1:6432")], &[addr("[::1]:6432"), addr("127.0.0.1:6432")]);
        assert_eq!(found, Some(addr("127.0.0.1:6432")));
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        RawConfig::from_toml(text)?.validate()
    }

    #[test]
    fn contract_example_parses() {
        let c = parse(
            r#"
            listen = "127.0.0.1:6432"
            upstream = "127.0.0.1:5432"
            [[fence]]
            name = "invoice-sweeper"
            database = "app"
            tables = ["public.sweep_state", "billing.invoices"]
            mode = "reject"
            [fence.lease]
            table = "public.leader_lease"
            "#,
        )
        .unwrap();
        let f = &c.fences[0];
        assert_eq!(f.tables[1], TableName::new(Some("billing"), "invoices"));
        assert_eq!(f.lease.as_ref().unwrap().row, "invoice-sweeper");
        assert_eq!(c.max_message_size, DEFAULT_MAX_MESSAGE_SIZE);
    }

    #[test]
    fn defaults_apply_to_an_empty_file() {
        let c = parse("").unwrap();
        assert_eq!(
            (c.listen.as_str(), c.upstream.as_str()),
            (DEFAULT_LISTEN, DEFAULT_UPSTREAM)
        );
        assert!(c.fences.is_empty());
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let cases = [
            ("lissen = \"x\"", "unknown field"),
            ("listen = \"nohost\"", "host:port"),
            ("[[fence]]\nname = \"a\"\ntables = []", "at least one table"),
            (
                "[[fence]]\nname = \"a\"\ntables = [\"t\"]\nmode = \"rewrite\"",
                "epoch_column",
            ),
            (
                "[[fence]]\nname = \"a\"\ntables = [\"t\"]\nmode = \"sideways\"",
                "unknown variant",
            ),
            (
                "[[fence]]\nname = \"a\"\ntables = [\"t\"]\n[[fence]]\nname = \"b\"\ntables = [\"public.t\"]",
                "at most one fence",
            ),
            (
                "[[fence]]\nname = \"a\"\ntables = [\"t\"]\n[[fence]]\nname = \"a\"\ntables = [\"u\"]",
                "twice",
            ),
            ("[[fence]]\nname = \"a\"\ntables = [\"t\"]\nbogus = 1", "unknown field"),
            (
                "[[fence]]\nname = \"a\"\ndatabase = \"\"\ntables = [\"t\"]",
                "must name a database",
            ),
            (
                "[[fence]]\nname = \"a\"\ndatabase = \"d123456789d123456789d123456789d123456789d123456789d123456789d123\"\n\
                 tables = [\"t\"]",
                "longer than 63 bytes",
            ),
            ("upstream = \"127.0.0.1:0\"", "port 0"),
            (
                "listen = \"127.0.0.1:7000\"\nupstream = \"127.0.0.1:7000\"",
                "is pgfence's own listen address",
            ),
            (
                "[[fence]]\nname = \"a\"\ntables = [\"t\", \"leader_lease\"]\n[fence.lease]\ntable = \"public.leader_lease\"",
                "lease table public.leader_lease is also a fenced table (of fence \"a\")",
            ),
            (
                "[[fence]]\nname = \"a\"\ntables = [\"t\"]\n[fence.lease]\ntable = \"leases\"\n\
                 [[fence]]\nname = \"b\"\ndatabase = \"x\"\ntables = [\"leases\"]",
                "is also a fenced table (of fence \"b\")",
            ),
            (
                "[[fence]]\nname = \"a\"\ntables = [\"t\", \"public.T\"]",
                "fence \"a\" lists table public.t twice",
            ),
            (
                "[[fence]]\nname = \"a\"\ntables = [\"t\"]\n[fence.lease]\ntable = \"leases\"\nrow = \"\"",
                "fence \"a\": lease: row must name the lease row",
            ),
        ];
        for (text, expect) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(expect), "{text:?} gave {err:?}");
        }
    }

    #[test]
    fn a_database_url_that_does_not_parse_is_refused() {
        let bad = RawConfig::from_toml("database_url = \"not a url at all ::\"\n").unwrap();
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("invalid database_url"), "{err}");
        let good = RawConfig::from_toml("database_url = \"postgres://app@127.0.0.1:5432/app\"\n").unwrap();
        assert!(good.validate().is_ok());
    }

    #[test]
    fn unquoted_epoch_columns_fold_ascii_letters_only() {
        assert_eq!(normalise_column("Last_Epoch").as_deref(), Some("last_epoch"));
        assert_eq!(normalise_column("Époch").as_deref(), Some("Époch"));
        assert_eq!(normalise_column("\"Époch\"").as_deref(), Some("Époch"));
    }

    #[test]
    fn epoch_column_in_reject_mode_is_a_warning() {
        let fence = "[[fence]]\nname = \"a\"\ntables = [\"t\"]\nepoch_column = \"last_epoch\"\n";
        let warnings = parse(fence).unwrap().warnings();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("fence \"a\": epoch_column"), "{warnings:?}");
        let rewrite = format!("{fence}mode = \"rewrite\"\n");
        assert!(parse(&rewrite).unwrap().warnings().is_empty());
    }

    #[test]
    fn an_unquoted_name_with_capitals_fences_the_table_spelled_as_written_too() {
        let config = parse("[[fence]]\nname = \"a\"\ntables = [\"Inv\", \"billing.ledger\"]").unwrap();
        let names: Vec<String> = config.fences[0].tables.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["public.inv", "billing.ledger", "public.\"Inv\""]);
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("table name Inv has capitals without quotes, so it names public.inv")
                && warnings[0].contains("fences public.\"Inv\" too"),
            "{warnings:?}"
        );
        // Named both ways, or quoted, or in lower case: one table each, and no warning.
        for tables in ["\"Inv\", \"\\\"Inv\\\"\"", "\"\\\"Inv\\\"\"", "\"inv\""] {
            let config = parse(&format!("[[fence]]\nname = \"a\"\ntables = [{tables}]")).unwrap();
            assert!(config.warnings().is_empty(), "{tables}");
            assert!(config.fences[0].as_written.is_empty(), "{tables}");
        }
        // The table as written belongs to this fence: another fence cannot claim it.
        let err =
            parse("[[fence]]\nname = \"a\"\ntables = [\"Inv\"]\n[[fence]]\nname = \"b\"\ntables = [\"\\\"Inv\\\"\"]")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("table public.\"Inv\" belongs to fence \"a\" and fence \"b\""),
            "{err}"
        );
    }

    #[test]
    fn a_fenced_table_named_like_the_lease_table_is_a_warning() {
        let text = "[[fence]]\nname = \"a\"\ntables = [\"app.leader_lease\"]\n[fence.lease]\ntable = \"leader_lease\"";
        let warnings = parse(text).unwrap().warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("also names the fenced table app.leader_lease"),
            "{warnings:?}"
        );
        let apart = "[[fence]]\nname = \"a\"\ndatabase = \"x\"\ntables = [\"app.leader_lease\"]\n\
                     [[fence]]\nname = \"b\"\ndatabase = \"y\"\ntables = [\"t\"]\n[fence.lease]\ntable = \"leader_lease\"";
        assert!(parse(apart).unwrap().warnings().is_empty());
    }

    #[test]
    fn connect_timeout_zero_means_no_limit() {
        assert_eq!(parse("connect_timeout = 0").unwrap().connect_timeout, Duration::MAX);
        assert_eq!(
            parse("connect_timeout = 2.5").unwrap().connect_timeout,
            Duration::from_millis(2500)
        );
    }

    #[test]
    fn a_lease_table_may_be_fenced_in_another_database() {
        let text = "[[fence]]\nname = \"a\"\ndatabase = \"x\"\ntables = [\"t\"]\n[fence.lease]\ntable = \"leases\"\n\
                    [[fence]]\nname = \"b\"\ndatabase = \"y\"\ntables = [\"leases\"]";
        assert_eq!(parse(text).unwrap().fences.len(), 2);
    }

    #[test]
    fn same_table_may_be_fenced_in_different_databases() {
        let text = "[[fence]]\nname = \"a\"\ndatabase = \"x\"\ntables = [\"t\"]\n[[fence]]\nname = \"b\"\ndatabase = \"y\"\ntables = [\"t\"]";
        assert_eq!(parse(text).unwrap().fences.len(), 2);
    }
}
