//! What `pgfence init` takes from the environment when its database URL leaves it out, as
//! libpq (psql, pg_dump) does: `PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD`, and
//! then the password file (`PGPASSFILE`, by default `~/.pgpass`).
//!
//! What the URL says always wins; `PGPASSWORD` wins over the file. Only the variables above
//! are read: a URL names what else it needs. With no host anywhere, the connection goes to
//! the server's Unix socket in the default directory, as libpq's does; an invalid `PGPORT` is
//! refused, as libpq refuses it.

use std::path::{Path, PathBuf};

use tokio_postgres::config::{Config, Host};

/// Where libpq looks for the server's Unix socket when nothing names a host: Debian's and
/// Red Hat's packages build it with `/var/run/postgresql`, Postgres' own default is `/tmp`.
pub const SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// Why a connection string cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConninfoError {
    /// The URL itself does not parse.
    #[error(transparent)]
    Url(#[from] tokio_postgres::Error),
    /// `PGPORT` holds no integer (libpq refuses it too, in these words).
    #[error("invalid integer value {0:?} for connection option \"port\" (from PGPORT)")]
    PortNotInteger(String),
    /// `PGPORT` holds an integer that is no TCP port.
    #[error("invalid port number: {0:?} (from PGPORT)")]
    PortOutOfRange(String),
}

/// `url` (a URL or `key=value` pairs) as a connection config, with what it leaves out taken
/// from `env` (a variable's value by name) and the password file, as libpq does. Also gives
/// warnings to print (a password file that others can read).
pub fn parse(url: &str, env: impl Fn(&str) -> Option<String>) -> Result<(Config, Vec<String>), ConninfoError> {
    env_port(&env)?;
    let mut db: Config = with_env_port(url, &env).parse()?;
    let warnings = apply_env(&mut db, env);
    if db.get_hosts().is_empty() && db.get_hostaddrs().is_empty() {
        let port = db.get_ports().first().copied().unwrap_or(5432);
        db.host_path(default_socket_dir(port, &SOCKET_DIRS));
    }
    Ok((db, warnings))
}

/// The port `PGPORT` names: `None` when it is unset or empty (libpq's default then), an
/// error in libpq's words when it holds no TCP port.
fn env_port(env: impl Fn(&str) -> Option<String>) -> Result<Option<u16>, ConninfoError> {
    let Some(port) = env("PGPORT").filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    match port.parse::<u16>() {
        Ok(p @ 1..) => Ok(Some(p)),
        _ => Err(match port.trim_end().parse::<i64>() {
            Ok(_) => ConninfoError::PortOutOfRange(port),
            Err(_) => ConninfoError::PortNotInteger(port),
        }),
    }
}

/// Where `db` connects, as libpq names it in its errors: `host:port`, or the socket's path;
/// several hosts are separated by commas.
pub fn describe(db: &Config) -> String {
    let ports = db.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let mut places: Vec<String> = db
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| match h {
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            #[cfg(unix)]
            Host::Unix(dir) => format!("socket {}", dir.join(format!(".s.PGSQL.{}", port(i))).display()),
        })
        .collect();
    if places.is_empty() {
        places = db
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{a}:{}", port(i)))
            .collect();
    }
    places.join(", ")
}

/// The first of `dirs` that holds the socket of a server on `port`, else the first of them
/// (the error then names the socket libpq would have tried).
fn default_socket_dir(port: u16, dirs: &[&str]) -> PathBuf {
    let socket = format!(".s.PGSQL.{port}");
    dirs.iter()
        .map(PathBuf::from)
        .find(|d| d.join(&socket).exists())
        .unwrap_or_else(|| PathBuf::from(dirs.first().copied().unwrap_or("/tmp")))
}

/// `url` with `PGPORT`'s port written after each of its hosts when it names no port (the
/// URL parser would put 5432 there, and libpq takes `PGPORT`). Other texts come back as
/// they are: a `key=value` string without `port` leaves the port for [`apply_env`].
fn with_env_port(url: &str, env: impl Fn(&str) -> Option<String>) -> String {
    let Ok(Some(port)) = env_port(env) else {
        return url.to_owned();
    };
    let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    else {
        return url.to_owned();
    };
    let scheme = &url[..url.len() - rest.len()];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let at = authority.rfind('@').map_or(0, |i| i + 1);
    let (userinfo, hosts) = authority.split_at(at);
    // A `:` outside `[…]` is a port; `port=` in the query names one too.
    let mut depth = 0;
    let names_port = hosts.chars().any(|c| {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ => {}
        }
        c == ':' && depth == 0
    }) || tail
        .split_once('?')
        .is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("port=")));
    if names_port || hosts.is_empty() {
        return url.to_owned();
    }
    let hosts: Vec<String> = hosts.split(',').map(|h| format!("{h}:{port}")).collect();
    format!("{scheme}{userinfo}{}{tail}", hosts.join(","))
}

/// Fills in what `db` lacks from `env` and the password file it names; returns the
/// warnings.
fn apply_env(db: &mut Config, env: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let mut warnings = Vec::new();
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    if db.get_hosts().is_empty()
        && db.get_hostaddrs().is_empty()
        && let Some(hosts) = env("PGHOST")
    {
        // A host starting with `/` is a directory of Unix sockets, as in libpq.
        for host in hosts.split(',') {
            db.host(host);
        }
    }
    // A URL host without a port got it from [`with_env_port`]; [`parse`] refused a bad one.
    if let Ok(Some(port)) = env_port(env)
        && db.get_ports().is_empty()
    {
        db.port(port);
    }
    if db.get_user().is_none()
        && let Some(user) = env("PGUSER").or_else(|| env("USER")).or_else(|| env("LOGNAME"))
    {
        db.user(user);
    }
    if db.get_dbname().is_none()
        && let Some(name) = env("PGDATABASE")
    {
        db.dbname(name);
    }
    if db.get_password().is_none() {
        if let Some(password) = env("PGPASSWORD") {
            db.password(password);
        } else if let Some(path) = env("PGPASSFILE")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".pgpass")))
            && let Some(password) = password_from_file(&path, db, &mut warnings)
        {
            db.password(password);
        }
    }
    warnings
}

/// The password `path` gives for `db`'s first host, port, database and user, if the file
/// is there, is a plain file only its owner can read, and has a matching line.
fn password_from_file(path: &Path, db: &Config, warnings: &mut Vec<String>) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        warnings.push(format!("password file {} is not a plain file; ignored", path.display()));
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            warnings.push(format!(
                "password file {} has group or world access; permissions should be u=rw (0600) or less; ignored",
                path.display()
            ));
            return None;
        }
    }
    let text = std::fs::read_to_string(path).ok()?;
    // A Unix socket counts as `localhost`, as in libpq.
    let host = match db.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => match db.get_hostaddrs().first() {
            Some(addr) => addr.to_string(),
            None => "localhost".to_owned(),
        },
    };
    let port = db.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = db.get_user()?;
    // Postgres' default database is the user's name.
    let dbname = db.get_dbname().unwrap_or(user);
    password_for(&text, [&host, &port, dbname, user])
}

/// The password of the first line of a password file (`host:port:database:user:password`,
/// `*` matching anything, `\` escaping the next character) that matches `want`.
fn password_for(text: &str, want: [&str; 4]) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .find_map(|line| {
            let mut fields = Vec::with_capacity(4);
            let mut field = String::new();
            let mut wildcard = true;
            let mut chars = line.chars();
            while fields.len() < 4 {
                match chars.next()? {
                    ':' => {
                        fields.push((wildcard && field == "*", std::mem::take(&mut field)));
                        wildcard = true;
                    }
                    '\\' => {
                        field.push(chars.next()?);
                        wildcard = false;
                    }
                    c => field.push(c),
                }
            }
            let matches = fields.iter().zip(want).all(|((any, f), w)| *any || f == w);
            matches.then(|| {
                let mut password = String::new();
                while let Some(c) = chars.next() {
                    password.push(if c == '\\' { chars.next().unwrap_or('\\') } else { c });
                }
                password
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn password_file_lines_match_as_libpq_reads_them() {
        let want = ["db.example", "5432", "app", "admin"];
        let text = "# comment\n\
                    other:5432:app:admin:no\n\
                    db.example:5432:app:admin:first\n\
                    db.example:5432:app:admin:second\n";
        assert_eq!(password_for(text, want).as_deref(), Some("first"));
        assert_eq!(password_for("*:*:*:*:any", want).as_deref(), Some("any"));
        assert_eq!(password_for("*:5433:*:*:x", want), None);
        // A `*` that is escaped, or part of a field, is a character.
        assert_eq!(password_for("\\*:*:*:*:x", want), None);
        assert_eq!(password_for("db.*:*:*:*:x", want), None);
        // Escaped `:` and `\` in fields and in the password; the password is the rest of the line.
        assert_eq!(
            password_for("a\\:b:*:*:*:p\\:w\\\\d:x", ["a:b", "1", "d", "u"]).as_deref(),
            Some("p:w\\d:x")
        );
        // Too few fields, or a line ending in an escape, match nothing.
        assert_eq!(password_for("db.example:5432:app", want), None);
        assert_eq!(password_for("db.example:5432:app\\", want), None);
        assert_eq!(password_for("*:*:*:*:", want).as_deref(), Some(""));
    }

    #[test]
    fn the_url_wins_over_the_environment() {
        let env = [
            ("PGHOST", "envhost"),
            ("PGPORT", "6543"),
            ("PGUSER", "envuser"),
            ("PGDATABASE", "envdb"),
            ("PGPASSWORD", "envpw"),
        ];
        for (url, [host, port, user, dbname, password]) in [
            ("postgres://u:pw@h:1/d", ["h", "1", "u", "d", "pw"]),
            ("postgres://", ["envhost", "6543", "envuser", "envdb", "envpw"]),
        ] {
            let mut db: Config = url.parse().unwrap();
            assert!(apply_env(&mut db, vars(&env)).is_empty());
            assert_eq!(db.get_hosts(), &[Host::Tcp(host.into())], "{url}");
            assert_eq!(db.get_ports(), &[port.parse::<u16>().unwrap()], "{url}");
            assert_eq!(db.get_user(), Some(user), "{url}");
            assert_eq!(db.get_dbname(), Some(dbname), "{url}");
            assert_eq!(db.get_password(), Some(password.as_bytes()), "{url}");
        }
    }

    #[test]
    fn user_falls_back_to_the_login_name_and_a_bad_port_is_refused() {
        let mut db: Config = "postgres:///d".parse().unwrap();
        assert!(apply_env(&mut db, vars(&[("USER", "me")])).is_empty());
        assert_eq!(db.get_user(), Some("me"));
        // As libpq: a PGPORT that is not a port fails, whatever the URL names.
        for url in ["postgres:///d", "postgres://h/d", "postgres://h:1/d"] {
            let err = parse(url, vars(&[("PGPORT", "port")])).unwrap_err();
            assert_eq!(
                err.to_string(),
                "invalid integer value \"port\" for connection option \"port\" (from PGPORT)"
            );
            for port in ["0", "65536", "-1"] {
                let err = parse(url, vars(&[("PGPORT", port)])).unwrap_err();
                assert_eq!(
                    err.to_string(),
                    format!("invalid port number: \"{port}\" (from PGPORT)")
                );
            }
        }
        // An empty one is unset, as in libpq.
        let (db, _) = parse("postgres://h/d", vars(&[("PGPORT", "")])).unwrap();
        assert_eq!(db.get_ports(), &[5432]);
    }

    #[test]
    fn without_a_host_the_default_socket_directory_is_used() {
        let dir = std::env::temp_dir().join(format!("pgfence-sockets-{}", std::process::id()));
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join(".s.PGSQL.6543"), "").unwrap();
        let dirs = [a.to_str().unwrap(), b.to_str().unwrap()];
        // The first directory holding the port's socket, else the first directory.
        assert_eq!(default_socket_dir(6543, &dirs), b);
        assert_eq!(default_socket_dir(5432, &dirs), a);
        std::fs::remove_dir_all(&dir).unwrap();
        // Only when neither the URL nor PGHOST names a host.
        let (db, _) = parse("postgres://u@/d?port=6543", vars(&[])).unwrap();
        assert!(matches!(db.get_hosts(), [Host::Unix(p)] if SOCKET_DIRS.iter().any(|d| p.as_path() == Path::new(d))));
        assert_eq!(db.get_ports(), &[6543]);
        let (db, _) = parse("postgres:///d", vars(&[("PGHOST", "h")])).unwrap();
        assert_eq!(db.get_hosts(), &[Host::Tcp("h".into())]);
        let (db, _) = parse("host=h", vars(&[])).unwrap();
        assert_eq!(db.get_hosts(), &[Host::Tcp("h".into())]);
        let (db, _) = parse("hostaddr=127.0.0.1 dbname=d", vars(&[])).unwrap();
        assert!(db.get_hosts().is_empty());
        assert_eq!(describe(&db), "127.0.0.1:5432");
    }

    #[test]
    fn a_connection_target_is_described_as_libpq_names_it() {
        let (db, _) = parse("postgres://h1:1,h2:2/d", vars(&[])).unwrap();
        assert_eq!(describe(&db), "h1:1, h2:2");
        let (db, _) = parse("postgres://u@%2Fvar%2Frun%2Fpostgresql/d", vars(&[("PGPORT", "6543")])).unwrap();
        assert_eq!(describe(&db), "socket /var/run/postgresql/.s.PGSQL.6543");
    }

    #[test]
    fn pgport_goes_after_hosts_that_name_no_port() {
        let port = |url: &str| with_env_port(url, vars(&[("PGPORT", "6543")]));
        assert_eq!(port("postgres://u:p@h/d"), "postgres://u:p@h:6543/d");
        assert_eq!(
            port("postgresql://h1,h2?sslmode=disable"),
            "postgresql://h1:6543,h2:6543?sslmode=disable"
        );
        assert_eq!(port("postgres://[::1]/d"), "postgres://[::1]:6543/d");
        assert_eq!(port("postgres://u@%2Ftmp/d"), "postgres://u@%2Ftmp:6543/d");
        for named in [
            "postgres://h:1/d",
            "postgres://[::1]:1/d",
            "postgres://h/d?port=1",
            "postgres:///d",
            "host=h",
        ] {
            assert_eq!(port(named), named);
        }
        assert_eq!(
            with_env_port("postgres://h/d", vars(&[("PGPORT", "0")])),
            "postgres://h/d"
        );
        let mut db: Config = port("postgres://u@h/d").parse().unwrap();
        assert!(apply_env(&mut db, vars(&[("PGPORT", "6543")])).is_empty());
        assert_eq!(db.get_ports(), &[6543]);
    }

    #[test]
    fn the_password_file_is_read_only_when_nothing_else_gives_a_password() {
        let dir = std::env::temp_dir().join(format!("pgfence-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(&file, "h:5432:d:u:from-file\nlocalhost:5432:u:u:local\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let path = file.to_str().unwrap();
        let password = |url: &str, env: &[(&str, &str)]| {
            let mut db: Config = url.parse().unwrap();
            let warnings = apply_env(&mut db, vars(env));
            (
                db.get_password().map(|p| String::from_utf8_lossy(p).into_owned()),
                warnings,
            )
        };
        let none: Vec<String> = Vec::new();
        assert_eq!(
            password("postgres://u@h/d", &[("PGPASSFILE", path)]),
            (Some("from-file".into()), none.clone())
        );
        assert_eq!(
            password("postgres://u@h/d", &[("PGPASSFILE", path), ("PGPASSWORD", "env")]),
            (Some("env".into()), none.clone())
        );
        // A Unix socket is `localhost`; the database defaults to the user's name.
        assert_eq!(
            password("postgres://u@%2Ftmp", &[("PGPASSFILE", path)]),
            (Some("local".into()), none.clone())
        );
        assert_eq!(
            password("postgres://u@h:5433/d", &[("PGPASSFILE", path)]),
            (None, none.clone())
        );
        assert_eq!(password("postgres://u@h/d", &[("HOME", "/nonexistent")]), (None, none));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
            let (got, warnings) = password("postgres://u@h/d", &[("PGPASSFILE", path)]);
            assert_eq!(got, None);
            assert!(warnings[0].contains("group or world access"), "{warnings:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
