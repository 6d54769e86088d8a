//! What `pgfence init` takes from the environment when its database URL leaves it out, as
//! libpq (psql, pg_dump) does: `PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD`, and
//! then the password file (`PGPASSFILE`, by default `~/.pgpass`).
//!
//! What the URL says always wins; `PGPASSWORD` wins over the file. Only the variables above
//! are read: a URL names what else it needs.

use std::path::{Path, PathBuf};

use tokio_postgres::config::{Config, Host};

/// `url` (a URL or `key=value` pairs) as a connection config, with what it leaves out taken
/// from `env` (a variable's value by name) and the password file, as libpq does. Also gives
/// warnings to print (an unusable `PGPORT`, a password file that others can read).
pub fn parse(url: &str, env: impl Fn(&str) -> Option<String>) -> Result<(Config, Vec<String>), tokio_postgres::Error> {
    let mut db: Config = with_env_port(url, &env).parse()?;
    let warnings = apply_env(&mut db, env);
    Ok((db, warnings))
}

/// `url` with `PGPORT`'s port written after each of its hosts when it names no port (the
/// URL parser would put 5432 there, and libpq takes `PGPORT`). Other texts come back as
/// they are: a `key=value` string without `port` leaves the port for [`apply_env`].
fn with_env_port(url: &str, env: impl Fn(&str) -> Option<String>) -> String {
    let Some(port) = env("PGPORT").filter(|p| matches!(p.parse::<u16>(), Ok(1..))) else {
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
    // A URL host without a port got it from [`with_env_port`].
    if let Some(port) = env("PGPORT") {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {
                if db.get_ports().is_empty() {
                    db.port(p);
                }
            }
            _ => warnings.push(format!("PGPORT={port:?} is not a port; ignored")),
        }
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
    fn user_falls_back_to_the_login_name_and_a_bad_port_is_said() {
        let mut db: Config = "postgres:///d".parse().unwrap();
        let warnings = apply_env(&mut db, vars(&[("USER", "me"), ("PGPORT", "port")]));
        assert_eq!(db.get_user(), Some("me"));
        assert!(db.get_ports().is_empty());
        assert_eq!(warnings, ["PGPORT=\"port\" is not a port; ignored"]);
        // Also when the URL's host takes the default port.
        let url = with_env_port("postgres://h/d", vars(&[("PGPORT", "port")]));
        let mut db: Config = url.parse().unwrap();
        let warnings = apply_env(&mut db, vars(&[("PGPORT", "port")]));
        assert_eq!(db.get_ports(), &[5432]);
        assert_eq!(warnings, ["PGPORT=\"port\" is not a port; ignored"]);
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
