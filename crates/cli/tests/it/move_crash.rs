//! kill -9 in the middle of a tablet move, real processes: of the
//! coordinator (the restarted one finishes or undoes the move), and of the
//! destination server (the move is undone, or, once committed, the tablet is
//! recovered from the backups onto a survivor). Either way the CLI tells the
//! truth, every acknowledged write is readable, writes are accepted again and
//! exactly one shard serves the tablet.

use crate::common;

use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Cluster, insitu_bin, rt};
use insitu_client::{Client, ClientConfig, RpcConn, TabletInfo};
use insitu_protocol::{Request, ServerState, Status, blob};
use tokio::runtime::Runtime;

/// Objects in the moved tablet: enough that the copy takes a while.
const OBJECTS: usize = 20_000;

/// How long the checks after a crash may wait for reads to succeed and for
/// a dead server to be declared dead: the coordinator's restart and
/// reconciliation, or a failure detection plus a recovery, take well under
/// this on a loaded machine; a hang fails the test in bounded time.
const SETTLE: Duration = Duration::from_secs(30);

/// How long a new server needs to learn its peers: one killed earlier keeps
/// its replicas on its own disk only, and its tablets cannot be recovered.
const LEARN_PEERS: Duration = Duration::from_millis(2500);

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

/// An object the test expects to read back: key and value.
type Object = (Vec<u8>, Vec<u8>);

/// A client whose operations outlast a restart of the coordinator and a
/// failure detection plus a recovery (writes wait for them, not fail).
async fn connect(addr: &str) -> Client {
    let config = ClientConfig {
        op_timeout: SETTLE,
        ..ClientConfig::default()
    };
    Client::connect_with(addr, config).await.expect("connect")
}

/// Table "m" of one tablet holding `OBJECTS` acknowledged objects: its id
/// and the objects.
fn load_table(cluster: &Cluster, rt: &Runtime) -> (u64, Vec<Object>) {
    let objects: Vec<Object> = (0..OBJECTS).map(|i| (key(i), vec![b'v'; 100])).collect();
    let table = rt.block_on(async {
        let client = connect(&cluster.addr()).await;
        let t = client.create_table("m", 1).await.unwrap();
        for chunk in objects.chunks(5000) {
            for r in client.multi_write(t.id, chunk).await.unwrap() {
                r.expect("write acknowledged");
            }
        }
        t.id
    });
    (table, objects)
}

/// The map's entry for the tablet of "m".
fn tablet(cluster: &Cluster, rt: &Runtime) -> TabletInfo {
    rt.block_on(async {
        let client = connect(&cluster.addr()).await;
        client.open_table("m").await.unwrap().tablets[0].clone()
    })
}

/// Write `during-ROUND-N` keys one after another until `stop`; the objects
/// whose writes were acknowledged (a failed write's outcome is unknown, so
/// it is not expected either way).
async fn write_until(
    client: Client,
    table: u64,
    round: usize,
    stop: Arc<AtomicBool>,
) -> Vec<Object> {
    let mut acked = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let object = (
            format!("during-{round}-{n}").into_bytes(),
            format!("value-{round}-{n}").into_bytes(),
        );
        if client.write(table, &object.0, &object.1).await.is_ok() {
            acked.push(object);
        }
        n += 1;
        // A steady trickle, not a flood: the machine's cores are for the move.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    acked
}

/// Run `insitu tablet move m 0 DEST` while a writer keeps writing to the
/// tablet; once `wait` returns (it gets the running CLI), `crash` the
/// cluster. Returns the CLI's output and the objects the writer had
/// acknowledged.
fn move_and_crash(
    cluster: &mut Cluster,
    rt: &Runtime,
    table: u64,
    round: usize,
    dest: u64,
    wait: impl FnOnce(&Cluster, &mut Child),
    crash: impl FnOnce(&mut Cluster),
) -> (Output, Vec<Object>) {
    let stop = Arc::new(AtomicBool::new(false));
    let client = rt.block_on(connect(&cluster.addr()));
    let writer = rt.spawn(write_until(client, table, round, stop.clone()));
    let mut mover = Command::new(insitu_bin())
        .args(["tablet", "move", "m", "0", &dest.to_string()])
        .env("INSITU_CLUSTER", cluster.addr())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run insitu tablet move");
    wait(cluster, &mut mover);
    crash(cluster);
    let out = mover.wait_with_output().expect("tablet move ends");
    stop.store(true, Ordering::Relaxed);
    let acked = rt.block_on(writer).expect("writer");
    (out, acked)
}

/// A `wait` for `move_and_crash`: a fixed time into the move.
fn wait_for(d: Duration) -> impl FnOnce(&Cluster, &mut Child) {
    move |_, _| std::thread::sleep(d)
}

/// A `wait` for `move_and_crash`: until the map names `dest` as the owner
/// (the move is committed; its activation may not be done yet), or the
/// move has ended without that.
fn until_map_names(rt: &Runtime, dest: u64) -> impl FnOnce(&Cluster, &mut Child) + '_ {
    move |cluster, mover| {
        rt.block_on(async {
            let client = connect(&cluster.addr()).await;
            let deadline = Instant::now() + SETTLE;
            while Instant::now() < deadline && mover.try_wait().expect("try_wait").is_none() {
                match client.open_table("m").await {
                    Ok(t) if t.tablets[0].server_id == dest => return,
                    _ => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
        })
    }
}

/// What `insitu tablet move` told the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    /// Exit 0: moved.
    Moved,
    /// Not moved: aborted (and undone, or being undone), rolled back, or
    /// refused (the destination already declared dead, or dead and already
    /// forgotten: a killed server is declared dead as soon as its port
    /// refuses a ping, and one without tablets is forgotten at once).
    NotMoved,
    /// Not moved: the coordinator could not be reached to ask.
    Unreachable,
    /// The map names the destination, activating it is not confirmed.
    Committed,
    /// Sent, no reply: the coordinator may still finish or undo it.
    Unknown,
}

/// Classify the CLI's verdict; any other message fails the round.
fn told(round: usize, out: &Output) -> Told {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let told = if out.status.success() {
        Told::Moved
    } else if stderr.contains("outcome unknown") {
        Told::Unknown
    } else if stderr.contains("the move is committed") {
        Told::Committed
    } else if stderr.contains("cannot reach") {
        Told::Unreachable
    } else if [
        "move aborted",
        "move rolled back",
        "is dead",
        "is on record",
    ]
    .iter()
    .any(|m| stderr.contains(m))
    {
        Told::NotMoved
    } else {
        panic!("round {round}: the move failed with an unexpected message: {stderr}");
    };
    eprintln!("round {round}: {told:?} {}", stderr.trim());
    told
}

/// The map after the round agrees with what the operator was told:
/// not moved means the same owner as `before`; moved or committed means a
/// new owner (a new map version; where it is now depends on later crashes).
fn told_the_truth(round: usize, told: Told, before: &TabletInfo, after: &TabletInfo) {
    match told {
        Told::NotMoved | Told::Unreachable => assert_eq!(
            (after.server_id, after.shard),
            (before.server_id, before.shard),
            "round {round}: told not moved, but the owner changed"
        ),
        Told::Moved | Told::Committed => assert!(
            after.map_version > before.map_version,
            "round {round}: told moved, but the map still has {before:?}"
        ),
        Told::Unknown => {}
    }
}

/// Every object in `expect` reads back its value. Reads that fail or miss
/// are retried (all of them within `SETTLE`) while the coordinator
/// reconciles or a recovery runs; a value never written fails at once.
async fn all_readable(client: &Client, table: u64, expect: &[Object], round: usize) {
    let deadline = Instant::now() + SETTLE;
    let mut pending: Vec<&Object> = expect.iter().collect();
    loop {
        let mut still = Vec::new();
        let mut last_error = String::new();
        for chunk in pending.chunks(5000) {
            let keys: Vec<&[u8]> = chunk.iter().map(|(k, _)| k.as_slice()).collect();
            let results = match client.multi_read(table, &keys).await {
                Ok(r) => r,
                Err(e) => {
                    last_error = e.to_string();
                    still.extend_from_slice(chunk);
                    continue;
                }
            };
            for (object, r) in chunk.iter().zip(results) {
                match r {
                    Ok(Some((v, _))) => assert_eq!(
                        v.as_ref(),
                        object.1.as_slice(),
                        "round {round}: {:?} holds a value never written",
                        String::from_utf8_lossy(&object.0)
                    ),
                    Ok(None) => still.push(*object),
                    Err(e) => {
                        last_error = e.to_string();
                        still.push(*object);
                    }
                }
            }
        }
        if still.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "round {round}: {} of {} acknowledged objects unreadable after {SETTLE:?} \
             (e.g. {:?}; last error: {last_error})",
            still.len(),
            expect.len(),
            String::from_utf8_lossy(&still[0].0)
        );
        pending = still;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The checks after every round, whatever was crashed: reads, a write, one
/// serving shard. Returns the tablet's map entry.
fn check_invariants(
    cluster: &Cluster,
    rt: &Runtime,
    table: u64,
    expect: &[Object],
    round: usize,
) -> TabletInfo {
    rt.block_on(async {
        let client = connect(&cluster.addr()).await;
        all_readable(&client, table, expect, round).await;
        client
            .write(table, format!("after-{round}").as_bytes(), b"x")
            .await
            .unwrap_or_else(|e| panic!("round {round}: not writable after the crash: {e}"));
        // Exactly one live shard serves it, the map's owner; every other
        // live shard answers UnknownTablet.
        let t = client.open_table("m").await.unwrap().tablets[0].clone();
        let servers = client.list_servers().await.unwrap();
        let mut serving = 0;
        for s in servers.iter().filter(|s| s.state == ServerState::Up) {
            for addr in &s.shard_addrs {
                let conn = RpcConn::connect(addr)
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: live shard {addr}: {e}"));
                let reply = conn
                    .call(&Request::Read {
                        table,
                        key: blob(&key(0)),
                    })
                    .await
                    .unwrap();
                if reply.status == Status::Ok {
                    serving += 1;
                    assert_eq!(
                        (s.id, addr),
                        (t.server_id, &t.addr),
                        "round {round}: a non-owner serves"
                    );
                } else {
                    assert_eq!(reply.status, Status::UnknownTablet, "round {round}: {addr}");
                }
            }
        }
        assert_eq!(serving, 1, "round {round}: exactly one serving owner");
        t
    })
}

/// Wait until no earlier move of the tablet is still being finished or
/// undone (the coordinator retries those in the background, and refuses a
/// new move meanwhile): a "move" to its current owner answers at once
/// then, and `Retry` before.
fn wait_no_move_pending(cluster: &Cluster, rt: &Runtime, round: usize) {
    rt.block_on(async {
        let client = connect(&cluster.addr()).await;
        let deadline = Instant::now() + SETTLE;
        loop {
            let owner = client.open_table("m").await.unwrap().tablets[0].server_id;
            match client.move_tablet("m", 0, owner).await {
                Ok(()) => return,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "round {round}: the last move is still not finished or undone: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Wait until the coordinator no longer counts server `id` as live.
fn wait_declared_dead(cluster: &Cluster, rt: &Runtime, id: u64, round: usize) {
    rt.block_on(async {
        let client = connect(&cluster.addr()).await;
        let deadline = Instant::now() + SETTLE;
        loop {
            let servers = client.list_servers().await.unwrap();
            if !servers
                .iter()
                .any(|s| s.id == id && s.state == ServerState::Up)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: server {id} still counted live {SETTLE:?} after kill -9"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[test]
fn killing_the_coordinator_during_a_move_leaves_one_owner_and_every_write() {
    let mut cluster = Cluster::start(2, 1);
    let rt = rt();
    let (table, mut expect) = load_table(&cluster, &rt);
    // Kill the coordinator at different moments of the move: before,
    // during and after the copy (where it lands varies; every outcome must
    // hold the invariants).
    for (round, kill_after_ms) in [0u64, 10, 40, 150].into_iter().enumerate() {
        wait_no_move_pending(&cluster, &rt, round);
        let before = tablet(&cluster, &rt);
        let dest = cluster
            .server_ids
            .iter()
            .copied()
            .find(|&s| s != before.server_id)
            .expect("two servers");
        let (out, acked) = move_and_crash(
            &mut cluster,
            &rt,
            table,
            round,
            dest,
            wait_for(Duration::from_millis(kill_after_ms)),
            // kill -9, then start on the same metadata
            Cluster::restart_coordinator,
        );
        expect.extend(acked);
        let told = told(round, &out);
        // Moved; no reply (sent, then the coordinator died); or killed
        // before the request was sent. A restart never makes the move fail.
        assert!(
            matches!(told, Told::Moved | Told::Unknown | Told::Unreachable),
            "round {round}: {told:?}"
        );
        let after = check_invariants(&cluster, &rt, table, &expect, round);
        told_the_truth(round, told, &before, &after);
    }
}

#[test]
fn killing_the_destination_during_a_move_leaves_one_owner_and_every_write() {
    // Three servers, so every segment has backups on the other two and a
    // killed destination's tablets can be recovered from them.
    let mut cluster = Cluster::start(3, 1);
    let rt = rt();
    let (table, mut expect) = load_table(&cluster, &rt);
    std::thread::sleep(LEARN_PEERS);
    // How long an undisturbed move takes through the CLI, to place the
    // kills at fractions of it: before the copy, during it, around the
    // commit and the activation (densest there: the window is narrow), and
    // once it is over (then the tablet is recovered from the backups).
    let before = tablet(&cluster, &rt);
    let dest = newest_but(&cluster, before.server_id);
    let started = Instant::now();
    let (out, acked) = move_and_crash(
        &mut cluster,
        &rt,
        table,
        0,
        dest,
        wait_for(Duration::ZERO),
        |_| {},
    );
    let full = started.elapsed();
    assert_eq!(told(0, &out), Told::Moved);
    expect.extend(acked);
    eprintln!("an undisturbed move takes {full:?} through the CLI");
    /// When a round kills the destination.
    #[derive(Clone, Copy, Debug)]
    enum When {
        /// This percentage of an undisturbed move's time into the move.
        Percent(u32),
        /// As soon as the map names it: committed, perhaps not activated.
        Committed,
    }
    let rounds = [
        When::Percent(0),
        When::Percent(25),
        When::Percent(50),
        When::Percent(60),
        When::Percent(70),
        When::Committed,
        When::Committed,
        When::Committed,
        When::Percent(100),
    ];
    for (round, when) in rounds.into_iter().enumerate() {
        let round = round + 1;
        eprintln!("round {round}: kill the destination at {when:?}");
        wait_no_move_pending(&cluster, &rt, round);
        let before = tablet(&cluster, &rt);
        // The newest server: it has learned its peers, and is not the owner
        // (the tablet was placed before it enlisted).
        let dest = newest_but(&cluster, before.server_id);
        let kill = |c: &mut Cluster| c.kill_server(dest);
        let (out, acked) = match when {
            When::Percent(p) => {
                let wait = wait_for(full * p / 100);
                move_and_crash(&mut cluster, &rt, table, round, dest, wait, kill)
            }
            When::Committed => {
                let wait = until_map_names(&rt, dest);
                move_and_crash(&mut cluster, &rt, table, round, dest, wait, kill)
            }
        };
        expect.extend(acked);
        let told = told(round, &out);
        wait_declared_dead(&cluster, &rt, dest, round);
        let after = check_invariants(&cluster, &rt, table, &expect, round);
        told_the_truth(round, told, &before, &after);
        // A fresh destination for the next round, once it knows its peers.
        cluster.add_server(1);
        std::thread::sleep(LEARN_PEERS);
    }
}

/// The most recently started server other than `owner`.
fn newest_but(cluster: &Cluster, owner: u64) -> u64 {
    *cluster
        .server_ids
        .iter()
        .rfind(|&&s| s != owner)
        .expect("a server besides the owner")
}
