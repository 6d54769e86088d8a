//! Authentication passes through untouched: trust, password, md5, SCRAM.

use crate::common::inproc::Proxy;
use crate::common::pg::{Cluster, config, connect_config};

#[tokio::test]
async fn every_auth_method_passes_through() {
    let cluster: &'static Cluster = Box::leak(Box::new(Cluster::start()));
    let admin = cluster.admin("postgres").await;
    admin
        .batch_execute(
            "SET password_encryption = 'md5';
             CREATE ROLE md5user LOGIN PASSWORD 'md5secret';
             CREATE ROLE pwuser LOGIN PASSWORD 'pwsecret';
             SET password_encryption = 'scram-sha-256';
             CREATE ROLE scramuser LOGIN PASSWORD 'scramsecret';
             CREATE ROLE trustuser LOGIN;
             CREATE ROLE nologinuser NOLOGIN;",
        )
        .await
        .unwrap();
    cluster
        .set_hba_and_reload(&[
            "host all md5user 127.0.0.1/32 md5",
            "host all pwuser 127.0.0.1/32 password",
            "host all scramuser 127.0.0.1/32 scram-sha-256",
            "host all trustuser 127.0.0.1/32 trust",
            "host all nologinuser 127.0.0.1/32 trust",
            "host all postgres 127.0.0.1/32 trust",
        ])
        .await;
    let proxy = Proxy::start(cluster.port(), "").await;
    for (user, password) in [
        ("md5user", "md5secret"),
        ("pwuser", "pwsecret"),
        ("scramuser", "scramsecret"),
        ("trustuser", ""),
    ] {
        let mut c = config(proxy.port(), "postgres");
        c.user(user);
        if !password.is_empty() {
            c.password(password);
        }
        let client = connect_config(&c).await.unwrap_or_else(|e| panic!("{user}: {e}"));
        let who: String = client.query_one("SELECT current_user::text", &[]).await.unwrap().get(0);
        assert_eq!(who, user);
        if !password.is_empty() {
            c.password("wrong");
            let err = connect_config(&c)
                .await
                .err()
                .unwrap_or_else(|| panic!("{user} with a wrong password"));
            assert_eq!(err.code().map(|c| c.code()), Some("28P01"), "{user}: {err}");
        }
    }
    // An invalid startup epoch is refused where Postgres refuses an invalid setting, once
    // the client has logged in: a wrong password, a role not allowed in, or a database that
    // does not exist gets Postgres' own error, which tells nothing of the fences.
    let proxy = Proxy::start(cluster.port(), crate::fencing::NO_LEASE).await;
    for (user, password, db, code) in [
        ("scramuser", "wrong", "postgres", "28P01"),
        ("md5user", "wrong", "postgres", "28P01"),
        ("nosuchuser", "", "postgres", "28000"),
        ("nologinuser", "", "postgres", "28000"),
        ("trustuser", "", "nosuchdb", "3D000"),
        ("scramuser", "scramsecret", "postgres", "PF003"),
        ("trustuser", "", "postgres", "PF003"),
    ] {
        let mut c = config(proxy.port(), db);
        c.user(user).options("-c pgfence.epoch=0");
        if !password.is_empty() {
            c.password(password);
        }
        let err = connect_config(&c)
            .await
            .err()
            .unwrap_or_else(|| panic!("{user}: connected with epoch 0"));
        assert_eq!(err.code().map(|c| c.code()), Some(code), "{user}: {err}");
        let named = err.as_db_error().is_some_and(|e| e.message().contains("sweeper"));
        assert_eq!(named, code == "PF003", "{user}: {err}");
    }
}

/// A client's password message is read up to Postgres' own limit (65535 bytes with the
/// length word): at the limit it reaches Postgres, which refuses the password (28P01); one
/// byte past it pgfence refuses it itself (08P01), where Postgres would close without a word.
/// Neither is blamed on the upstream.
#[tokio::test]
async fn a_password_message_is_read_up_to_postgres_limit() {
    use crate::common::raw::{Raw, codes, message, startup_packet};
    let cluster: &'static Cluster = Box::leak(Box::new(Cluster::start()));
    let admin = cluster.admin("postgres").await;
    admin
        .batch_execute("CREATE ROLE pwuser LOGIN PASSWORD 'pwsecret'")
        .await
        .unwrap();
    cluster
        .set_hba_and_reload(&[
            "host all pwuser 127.0.0.1/32 password",
            "host all postgres 127.0.0.1/32 trust",
        ])
        .await;
    let proxy = Proxy::start(cluster.port(), "").await;
    for (body, code) in [(65531usize, "28P01"), (65532, "08P01")] {
        let mut raw = Raw::connect(proxy.port()).await;
        raw.send(&startup_packet(&[("user", "pwuser"), ("database", "postgres")]))
            .await;
        let asked = raw.read_until(|m| m.tag == b'R').await;
        assert_eq!(
            asked.last().map(|m| (m.tag, m.body.clone())),
            Some((b'R', vec![0, 0, 0, 3]))
        );
        let mut password = vec![b'x'; body - 1];
        password.push(0);
        raw.send(&message(b'p', &password)).await;
        let replies = raw.read_until(|m| m.tag == b'E').await;
        assert_eq!(codes(&replies), [code], "a body of {body} bytes");
        assert!(raw.closed().await, "a body of {body} bytes: not closed");
    }
}
