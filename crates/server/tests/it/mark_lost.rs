//! The shard's side of lost objects (ARCHITECTURE.md, "Lost objects"): a
//! `MarkLost` naming a tablet the shard does not hold (one of another shard,
//! a start hash inside a tablet held here, a table that does not exist) is
//! refused with `UnknownTablet` and changes nothing: the shard's tablets
//! keep answering as before, no missing key reads `DataLost` and no version
//! jumps to the floor. The same request naming a tablet held here does both,
//! which shows the checks below would see a mark.

use crate::common;

use insitu_client::{Client, RpcConn, TableInfo};
use insitu_protocol::{Request, Response, Status, blob};

/// The server the lost objects went with: any id other than 0 (0 clears a mark).
const LOST_FROM: u64 = 77;
/// A version floor far above every version this test hands out.
const FLOOR: u64 = 1 << 50;

fn mark(table: u64, start_hash: u64, lost_from: u64, version_floor: u64) -> Request<'static> {
    Request::MarkLost {
        table,
        start_hash,
        lost_from,
        version_floor,
    }
}

/// Read `key` on `conn`: the status, and the value and version if found.
async fn read(conn: &RpcConn, table: u64, key: &str) -> (Status, Option<(Vec<u8>, u64)>) {
    let reply = conn
        .call(&Request::Read {
            table,
            key: blob(key.as_bytes()),
        })
        .await
        .unwrap();
    match reply.decode().unwrap() {
        Response::Read { value, version, .. } => (reply.status, Some((value.to_vec(), version))),
        _ => (reply.status, None),
    }
}

/// Write `key` unconditionally on `conn`; the version it got.
async fn write(conn: &RpcConn, table: u64, key: &str, value: &[u8]) -> u64 {
    let reply = common::raw_write(conn, table, key, value).await;
    assert_eq!(reply.status, Status::Ok, "{}", reply.error_message());
    match reply.decode().unwrap() {
        Response::Written { version } => version,
        other => panic!("{other:?} to Write"),
    }
}

/// A tablet as the test sees it: its shard, a key it holds with that key's
/// version, and a key it does not hold.
struct Probe {
    conn: RpcConn,
    table: u64,
    /// Its index in the table's tablets.
    tablet: usize,
    present: String,
    version: u64,
    absent: String,
}

impl Probe {
    /// The tablet answers as an unmarked one: the present key with its
    /// value and version, the absent one as never written, and a write
    /// with a version below the floor.
    async fn unchanged(&self, info: &TableInfo, when: &str) {
        let (status, found) = read(&self.conn, self.table, &self.present).await;
        assert_eq!(status, Status::Ok, "{when}: {}", self.present);
        assert_eq!(
            found,
            Some((b"kept".to_vec(), self.version)),
            "{when}: {}",
            self.present
        );
        let (status, _) = read(&self.conn, self.table, &self.absent).await;
        assert_eq!(status, Status::ObjectDoesntExist, "{when}: {}", self.absent);
        // A new key each time: the present key's version stays as recorded.
        let fresh = common::key_in(info, self.tablet, when);
        let version = write(&self.conn, self.table, &fresh, b"new").await;
        assert!(version < FLOOR, "{when}: {fresh} got version {version}");
    }
}

#[tokio::test]
async fn mark_lost_for_a_tablet_not_held_is_refused_and_changes_nothing() {
    // Two shards: "a tablet not held" includes one the other shard holds.
    let node = common::start(|c| c.shards = 2).await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let info = client.create_table("marks", 4).await.unwrap();
    let t = info.id;
    let here = 0;
    let there = info
        .tablets
        .iter()
        .position(|tb| tb.addr != info.tablets[here].addr)
        .expect("the table's tablets spread over both shards");
    let mut probes = Vec::new();
    for index in [here, there] {
        let conn = RpcConn::connect(&info.tablets[index].addr).await.unwrap();
        let present = common::key_in(&info, index, "present");
        let version = write(&conn, t, &present, b"kept").await;
        probes.push(Probe {
            conn,
            table: t,
            tablet: index,
            absent: common::key_in(&info, index, "absent"),
            present,
            version,
        });
    }
    let shard = &probes[0].conn;
    let here_start = info.tablets[here].start_hash;
    // Inside the tablet held here without starting any tablet.
    assert!(info.tablets[here].end_hash > here_start + 1);
    let not_held = [
        (t, info.tablets[there].start_hash),
        (t, here_start + 1),
        // Only one table is created: no table has this id.
        (u64::MAX, here_start),
    ];
    // A mark with and without a floor (with one, the engine's exact-start
    // lookup would refuse too; without, only the shard's own check does),
    // and a cleared mark (an acknowledgement).
    let requests = [(LOST_FROM, 0), (LOST_FROM, FLOOR), (0, 0)];
    for (table, start_hash) in not_held {
        for (lost_from, floor) in requests {
            let reply = shard
                .call(&mark(table, start_hash, lost_from, floor))
                .await
                .unwrap();
            assert_eq!(
                reply.status,
                Status::UnknownTablet,
                "MarkLost{{{table}, {start_hash:#x}, {lost_from}, {floor}}}: {}",
                reply.error_message()
            );
        }
    }
    for probe in &probes {
        probe.unchanged(&info, "after the refused marks").await;
    }

    // The control: the same request naming the tablet held here marks it.
    let reply = shard
        .call(&mark(t, here_start, LOST_FROM, FLOOR))
        .await
        .unwrap();
    assert_eq!(reply.status, Status::Ok, "{}", reply.error_message());
    assert!(matches!(reply.decode().unwrap(), Response::Done));
    let p = &probes[0];
    let (status, _) = read(shard, t, &p.absent).await;
    assert_eq!(
        status,
        Status::DataLost,
        "{} in the marked tablet",
        p.absent
    );
    let (status, found) = read(shard, t, &p.present).await;
    assert_eq!(status, Status::Ok);
    assert_eq!(found, Some((b"kept".to_vec(), p.version)));
    let fresh = common::key_in(&info, here, "after the mark");
    let version = write(shard, t, &fresh, b"new").await;
    assert!(version >= FLOOR, "a write after the floor got {version}");
    // The other shard's tablet was not marked by it.
    probes[1]
        .unchanged(&info, "after marking the other shard's tablet")
        .await;
    // Cleared, the tablet answers "no such object" again.
    let reply = shard.call(&mark(t, here_start, 0, 0)).await.unwrap();
    assert_eq!(reply.status, Status::Ok, "{}", reply.error_message());
    let (status, _) = read(shard, t, &p.absent).await;
    assert_eq!(status, Status::ObjectDoesntExist);
    drop(node);
}
