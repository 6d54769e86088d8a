//! Every way to declare an epoch to pgfence from tokio-postgres, each followed by
//! `SHOW pgfence.epoch` (pgfence forwards declarations upstream, so Postgres agrees).
//!
//! Needs a running pgfence; nothing is written.
//!
//! ```text
//! cargo run --example declare_epoch -- postgres://postgres@127.0.0.1:6432/app
//! ```
//!
//! The URL comes from the first argument or `PGFENCE_URL`.

use anyhow::Context;
use tokio_postgres::{Client, NoTls};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PGFENCE_URL").ok())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:6432/app".into());

    // 1. In the connection string: libpq's `options` parameter carries `-c pgfence.epoch=N`
    //    (URL-encoded: space is %20, `=` is %3D). This is the session's value at connection time.
    let separator = if url.contains('?') { '&' } else { '?' };
    let client = connect(&format!("{url}{separator}options=-c%20pgfence.epoch%3D7")).await?;
    show(&client, "connected with options=-c pgfence.epoch=7").await?;

    // The same through the builder API instead of the URL.
    let mut config: tokio_postgres::Config = url.parse()?;
    config.options("-c pgfence.epoch=7");
    let (_other, connection) = config.connect(NoTls).await?;
    tokio::spawn(connection);

    // 2. SET (or SET SESSION … TO …): the session's epoch from now on; the latest declaration wins.
    client.batch_execute("SET pgfence.epoch = 8").await?;
    show(&client, "after SET pgfence.epoch = 8").await?;
    client.batch_execute("SET SESSION pgfence.epoch TO 9").await?;
    show(&client, "after SET SESSION pgfence.epoch TO 9").await?;

    // 3. SET LOCAL: for the current transaction only.
    client.batch_execute("BEGIN; SET LOCAL pgfence.epoch = 10").await?;
    show(&client, "inside BEGIN, after SET LOCAL pgfence.epoch = 10").await?;
    client.batch_execute("COMMIT").await?;
    show(&client, "after COMMIT (SET LOCAL ended with the transaction)").await?;

    // A session SET inside a rolled-back transaction is undone, as Postgres does.
    client.batch_execute("BEGIN; SET pgfence.epoch = 11; ROLLBACK").await?;
    show(&client, "after BEGIN; SET pgfence.epoch = 11; ROLLBACK").await?;

    // 4. RESET (or SET … = DEFAULT): back to the value given at connection time.
    client.batch_execute("RESET pgfence.epoch").await?;
    show(&client, "after RESET pgfence.epoch").await?;

    // With several fences configured, name the fence too.
    client.batch_execute("SET pgfence.fence = 'invoice-sweeper'").await?;

    // An invalid epoch is refused where it is declared (PF003) and the session keeps its epoch.
    match client.batch_execute("SET pgfence.epoch = 0").await {
        Err(e) => println!(
            "{:<55} -> refused: {} {}",
            "SET pgfence.epoch = 0",
            code(&e),
            message(&e)
        ),
        Ok(()) => println!("SET pgfence.epoch = 0 was accepted: is this connection going through pgfence?"),
    }
    show(&client, "after the refused SET").await?;
    Ok(())
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("connection ended: {e}");
        }
    });
    Ok(client)
}

async fn show(client: &Client, what: &str) -> anyhow::Result<()> {
    let rows = client.simple_query("SHOW pgfence.epoch").await?;
    let value = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    });
    println!("{what:<55} -> pgfence.epoch = {}", value.as_deref().unwrap_or("?"));
    Ok(())
}

fn code(e: &tokio_postgres::Error) -> &str {
    e.code().map_or("", |c| c.code())
}

fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |db| db.message().to_owned())
}
