//! The lease of the seed design (`pgfence::lease`) on a real Postgres: one leader at a time,
//! epochs that only go up on acquisition, and a leader that steps down by its own clock before a
//! rival can take over by the database's.

use std::net::SocketAddr;
use std::time::Duration;

use pgfence::fence::epoch::Epoch;
use pgfence::lease::{Elector, StepDown};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, sleep, timeout};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::common::pg::{Cluster, config, connect};

const ROW: &str = "invoice-sweeper";

/// A fresh database with an empty lease row; returns its name and a direct connection.
async fn lease_db() -> (String, Client) {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let client = connect(cluster.port(), &db, "").await;
    let setup = Elector::new(ROW, "setup");
    client.batch_execute(&setup.create_table_sql()).await.unwrap();
    setup.ensure_row(&client).await.unwrap();
    (db, client)
}

async fn lease_epoch(client: &Client) -> i64 {
    client
        .query_one("SELECT epoch FROM leader_lease WHERE name = $1", &[&ROW])
        .await
        .unwrap()
        .get(0)
}

fn elector(holder: &str, lease: Duration) -> Elector {
    Elector::new(ROW, holder).lease(lease)
}

#[tokio::test]
async fn concurrent_acquisitions_elect_one_leader_and_epochs_strictly_rise() {
    let (db, admin) = lease_db().await;
    let port = Cluster::shared().port();
    let (ca, cb) = (connect(port, &db, "").await, connect(port, &db, "").await);
    let (a, b) = (
        elector("node-a", Duration::from_secs(60)),
        elector("node-b", Duration::from_secs(60)),
    );
    let mut last = 0;
    for round in 0..10 {
        let (ra, rb) = tokio::join!(a.acquire(&ca), b.acquire(&cb));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let (winner, client, epoch) = match (ra, rb) {
            (Some(e), None) => (&a, &ca, e),
            (None, Some(e)) => (&b, &cb, e),
            other => panic!("round {round}: exactly one leader expected, got {other:?}"),
        };
        assert!(epoch.get() > last, "round {round}: epoch {epoch} after {last}");
        assert_eq!(lease_epoch(&admin).await, epoch.as_i64());
        let state = winner.inspect(client).await.unwrap().unwrap();
        assert_eq!(state.holder.as_deref(), Some(winner.holder()));
        assert!(state.is_held());
        last = epoch.get();
        assert!(winner.release(client, epoch).await.unwrap());
    }
    assert_eq!(last, 10, "every acquisition bumps the epoch by one");
}

#[tokio::test]
async fn renewals_keep_the_epoch_and_reacquiring_starts_a_new_term() {
    let (_db, client) = lease_db().await;
    let (a, b) = (
        elector("node-a", Duration::from_secs(60)),
        elector("node-b", Duration::from_secs(60)),
    );
    let epoch = a.acquire(&client).await.unwrap().expect("vacant lease");
    for _ in 0..5 {
        assert!(a.renew(&client, epoch).await.unwrap(), "the holder renews at its epoch");
    }
    assert_eq!(
        lease_epoch(&client).await,
        epoch.as_i64(),
        "renewals never bump the epoch"
    );

    let other = Epoch::new(epoch.get() + 1).unwrap();
    assert!(
        !a.renew(&client, other).await.unwrap(),
        "a renewal names the epoch it extends"
    );
    assert!(!b.renew(&client, epoch).await.unwrap(), "only the holder renews");
    assert_eq!(
        b.acquire(&client).await.unwrap(),
        None,
        "an unexpired lease is not up for grabs"
    );

    // As in the seed's SQL, the holder acquiring again is a new term with a new epoch.
    let again = a.acquire(&client).await.unwrap().expect("the holder may re-acquire");
    assert_eq!(again, other);
    assert!(
        !a.renew(&client, epoch).await.unwrap(),
        "the old term cannot be extended any more"
    );
    assert!(a.renew(&client, again).await.unwrap());
}

#[tokio::test]
async fn release_lets_the_rival_in_at_once() {
    let (_db, client) = lease_db().await;
    let (a, b) = (
        elector("node-a", Duration::from_secs(60)),
        elector("node-b", Duration::from_secs(60)),
    );
    let epoch = a.acquire(&client).await.unwrap().unwrap();
    assert_eq!(b.acquire(&client).await.unwrap(), None);
    assert!(a.release(&client, epoch).await.unwrap());
    assert_eq!(lease_epoch(&client).await, epoch.as_i64(), "a release keeps the epoch");
    let taken = b
        .acquire(&client)
        .await
        .unwrap()
        .expect("a released lease is free at once, not after 60 s");
    assert!(taken > epoch);
    assert!(!a.renew(&client, epoch).await.unwrap());
    assert!(
        !a.release(&client, epoch).await.unwrap(),
        "releasing someone else's lease changes nothing"
    );
    assert_eq!(
        b.inspect(&client).await.unwrap().unwrap().holder.as_deref(),
        Some("node-b")
    );
}

#[tokio::test]
async fn an_expired_lease_goes_to_the_rival_by_the_database_clock() {
    let (_db, client) = lease_db().await;
    let lease = Duration::from_millis(600);
    let (a, b) = (elector("node-a", lease), elector("node-b", lease));
    let sent = Instant::now();
    let first = a.acquire(&client).await.unwrap().unwrap();
    let taken = loop {
        if let Some(e) = b.acquire(&client).await.unwrap() {
            break e;
        }
        sleep(Duration::from_millis(20)).await;
    };
    assert!(
        sent.elapsed() >= lease - Duration::from_millis(50),
        "taken over after {:?}",
        sent.elapsed()
    );
    assert!(taken > first);
    assert!(
        !a.renew(&client, first).await.unwrap(),
        "an expired term cannot be renewed"
    );
}

#[tokio::test]
async fn a_leader_renews_in_the_background_without_bumping_the_epoch() {
    let (db, client) = lease_db().await;
    let lease = Duration::from_secs(3);
    let a = elector("node-a", lease);
    let leadership = a.lead(&config(Cluster::shared().port(), &db)).await.unwrap();
    sleep(lease + a.tick() + Duration::from_millis(500)).await;
    assert!(
        leadership.is_leading(),
        "renewals kept the lease: {:?}",
        leadership.step_down_reason()
    );
    assert_eq!(lease_epoch(&client).await, leadership.epoch.as_i64());
    let state = a.inspect(&client).await.unwrap().unwrap();
    assert!(
        state.expires_in > 0.0,
        "the lease was extended past its first term: {state:?}"
    );

    let token = leadership.token.clone();
    let epoch = leadership.epoch;
    leadership.release().await;
    assert!(token.is_cancelled(), "release fires the token");
    let rival = elector("node-b", lease).acquire(&client).await.unwrap();
    assert!(rival.is_some_and(|e| e > epoch), "released at once: {rival:?}");
}

#[tokio::test]
async fn lead_waits_for_the_leader_to_go_and_only_one_leads() {
    let (db, _client) = lease_db().await;
    let pg = config(Cluster::shared().port(), &db);
    let lease = Duration::from_secs(3);
    let first = elector("node-a", lease).lead(&pg).await.unwrap();
    let b = elector("node-b", lease);
    let waiting = tokio::spawn(async move { b.lead(&pg).await });
    sleep(lease + Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "node-b must not lead while node-a renews");
    let (epoch, token) = (first.epoch, first.token.clone());
    first.release().await;
    let second = timeout(lease, waiting)
        .await
        .expect("node-b takes over within a tick")
        .unwrap()
        .unwrap();
    assert!(token.is_cancelled());
    assert!(second.epoch > epoch);
    second.release().await;
}

#[tokio::test]
async fn a_frozen_leader_steps_down_by_its_own_clock_before_a_rival_takes_over() {
    assert_step_down_before_takeover(Fault::Freeze).await;
}

#[tokio::test]
async fn a_leader_that_loses_its_connection_steps_down_within_the_deadline() {
    assert_step_down_before_takeover(Fault::Cut).await;
}

/// Leads through a relay, breaks the relay, and checks the order of events: the leader's token
/// fires no later than 2/3 of the lease after its last renewal could have been sent, and a rival
/// polling the database directly gets the lease only afterwards.
async fn assert_step_down_before_takeover(fault: Fault) {
    let (db, client) = lease_db().await;
    let cluster = Cluster::shared();
    let relay = Relay::start(cluster.addr()).await;
    let lease = Duration::from_millis(3000);
    let a = elector("node-a", lease);
    let leadership = a.lead(&config(relay.addr.port(), &db)).await.unwrap();
    // Let one renewal through, then break the leader's path to the database.
    sleep(a.tick() + Duration::from_millis(100)).await;
    assert!(leadership.is_leading());
    let broken = Instant::now();
    relay.apply(fault);

    let rival = elector("node-b", lease);
    let both = async {
        tokio::join!(
            async {
                let why = leadership.stepped_down().await;
                (Instant::now(), why)
            },
            async {
                loop {
                    if let Some(e) = rival.acquire(&client).await.unwrap() {
                        return (Instant::now(), e);
                    }
                    sleep(Duration::from_millis(20)).await;
                }
            }
        )
    };
    let ((down_at, why), (taken_at, epoch)) = timeout(lease * 3, both)
        .await
        .unwrap_or_else(|_| panic!("{fault:?}: the leader never stepped down"));
    assert_eq!(why, StepDown::Deadline, "{fault:?}");
    // The last renewal that got through was sent at most a tick before the fault.
    let limit = a.give_up_after() + Duration::from_millis(300);
    assert!(
        down_at - broken <= limit,
        "{fault:?}: stepped down {:?} after the fault",
        down_at - broken
    );
    assert!(
        down_at < taken_at,
        "{fault:?}: the rival took over before the leader stepped down"
    );
    assert!(
        taken_at - down_at >= a.tick() / 2,
        "{fault:?}: the margin between step-down and takeover should be about a third of the lease, was {:?}",
        taken_at - down_at
    );
    assert!(epoch > leadership.epoch);
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Bytes stop flowing both ways, connections stay open (a partition, or a paused peer).
    Freeze,
    /// Every connection is closed and new ones are refused.
    Cut,
}

/// A TCP relay to Postgres that a test can break.
struct Relay {
    addr: SocketAddr,
    frozen: CancellationToken,
    cut: CancellationToken,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay {
            addr: listener.local_addr().unwrap(),
            frozen: CancellationToken::new(),
            cut: CancellationToken::new(),
        };
        let (frozen, cut) = (relay.frozen.clone(), relay.cut.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = cut.cancelled() => return, // drops the listener: new connects are refused
                    r = listener.accept() => r,
                };
                let Ok((client, _)) = accepted else { continue };
                tokio::spawn(pipe(client, upstream, frozen.clone(), cut.clone()));
            }
        });
        relay
    }

    fn apply(&self, fault: Fault) {
        match fault {
            Fault::Freeze => self.frozen.cancel(),
            Fault::Cut => self.cut.cancel(),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut.cancel();
    }
}

async fn pipe(mut client: TcpStream, upstream: SocketAddr, frozen: CancellationToken, cut: CancellationToken) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        // Stop moving bytes but keep both sockets open until the relay is cut.
        () = frozen.cancelled() => cut.cancelled().await,
        () = cut.cancelled() => {}
    }
}
