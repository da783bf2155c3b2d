//! The fake coordinator: tables and their tablet maps over the fake shards,
//! tablet moves behind the client's back, and `FakeCluster`, the whole.

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use insitu_keyhash::HashRange;
use insitu_protocol::*;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

use super::shard::{FakeShard, ShardState};
use super::{Action, Logged, err, ok, serve};

/// What the fake coordinator knows.
pub struct CoordState {
    /// Every table and its tablet map.
    pub tables: Vec<TableInfo>,
    /// Bumped on every create, drop and move.
    pub map_version: u64,
    /// Last table id handed out.
    pub next_table_id: u64,
    /// (server id, shard address, shard state) of every fake shard.
    pub shards: Vec<(u64, String, Arc<Mutex<ShardState>>)>,
    /// Every request received, in order.
    pub log: Vec<Logged>,
}

impl CoordState {
    pub fn count(&self, op: &str) -> usize {
        self.log.iter().filter(|l| l.op == op).count()
    }

    /// Move tablet `index` of table `table` to the shard of `server_id`:
    /// its objects and ownership go over, the map version goes up.
    pub fn move_tablet(
        &mut self,
        table: u64,
        index: usize,
        server_id: u64,
    ) -> Result<(), (Status, String)> {
        let Some(dest) = self.shards.iter().find(|s| s.0 == server_id).cloned() else {
            return Err((Status::UnknownServer, format!("no server {server_id}")));
        };
        self.map_version += 1;
        let version = self.map_version;
        let Some(info) = self.tables.iter_mut().find(|t| t.id == table) else {
            return Err((Status::UnknownTable, format!("no table {table}")));
        };
        let Some(tablet) = info.tablets.get_mut(index) else {
            return Err((Status::BadRequest, format!("no tablet {index}")));
        };
        let range = HashRange {
            start: tablet.start_hash,
            end: tablet.end_hash,
        };
        let src = self
            .shards
            .iter()
            .find(|s| s.0 == tablet.server_id)
            .cloned()
            .expect("source shard");
        tablet.server_id = server_id;
        tablet.addr = dest.1.clone();
        tablet.map_version = version;
        info.map_version = version;
        if Arc::ptr_eq(&src.2, &dest.2) {
            return Ok(());
        }
        let mut s = src.2.lock().unwrap();
        let mut d = dest.2.lock().unwrap();
        s.tablets.retain(|(t, r)| !(*t == table && *r == range));
        for key in s.keys_in(table, range) {
            let o = s.data.remove(&(table, key.clone())).unwrap();
            d.version = d.version.max(o.version);
            d.data.insert((table, key), o);
        }
        d.version = d.version.max(s.version);
        d.tablets.push((table, range));
        Ok(())
    }
}

fn coord_handle(
    st: &mut CoordState,
    req: &Request<'_>,
    id: u64,
    out: &mut BytesMut,
) -> (Action, Status) {
    let status = match req {
        Request::Ping => ok(out, id, &Response::Pong),
        Request::CreateTable { name, tablets, .. } => {
            if st.tables.iter().any(|t| &t.name == name) {
                err(
                    out,
                    id,
                    Status::TableExists,
                    &format!("table {name} exists"),
                )
            } else {
                st.map_version += 1;
                st.next_table_id += 1;
                let table = st.next_table_id;
                let ranges = HashRange::split_even(u64::from(*tablets));
                let tablets: Vec<TabletInfo> = ranges
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let (server_id, addr, shard) = &st.shards[i % st.shards.len()];
                        shard.lock().unwrap().tablets.push((table, *r));
                        TabletInfo {
                            start_hash: r.start,
                            end_hash: r.end,
                            server_id: *server_id,
                            shard: 0,
                            addr: addr.clone(),
                            map_version: st.map_version,
                            lost_from: 0,
                        }
                    })
                    .collect();
                let info = TableInfo {
                    id: table,
                    name: name.clone(),
                    tablets,
                    schema: None,
                    indexes: Vec::new(),
                    map_version: st.map_version,
                };
                st.tables.push(info.clone());
                ok(out, id, &Response::Table(info))
            }
        }
        Request::DropTable { name } => match st.tables.iter().position(|t| &t.name == name) {
            None => err(
                out,
                id,
                Status::UnknownTable,
                &format!("no table named {name}"),
            ),
            Some(i) => {
                let info = st.tables.remove(i);
                st.map_version += 1;
                for (_, _, shard) in &st.shards {
                    let mut s = shard.lock().unwrap();
                    s.tablets.retain(|(t, _)| *t != info.id);
                    s.data.retain(|(t, _), _| *t != info.id);
                }
                ok(out, id, &Response::Done)
            }
        },
        Request::OpenTable { name } => match st.tables.iter().find(|t| &t.name == name) {
            Some(t) => ok(out, id, &Response::Table(t.clone())),
            None => err(
                out,
                id,
                Status::UnknownTable,
                &format!("no table named {name}"),
            ),
        },
        Request::TableMap { table } => match st.tables.iter().find(|t| t.id == *table) {
            Some(t) => ok(out, id, &Response::Table(t.clone())),
            None => err(
                out,
                id,
                Status::UnknownTable,
                &format!("no table with id {table}"),
            ),
        },
        Request::ListTables => ok(out, id, &Response::Tables(st.tables.clone())),
        Request::ListServers => {
            let servers = st
                .shards
                .iter()
                .map(|(id, addr, _)| ServerInfo {
                    id: *id,
                    shard_addrs: vec![addr.clone()],
                    backup_addr: String::new(),
                    state: insitu_protocol::ServerState::Up,
                })
                .collect();
            ok(out, id, &Response::Servers(servers))
        }
        Request::MoveTablet {
            table,
            tablet_index,
            server_id,
        } => match st.tables.iter().find(|t| &t.name == table).map(|t| t.id) {
            None => err(
                out,
                id,
                Status::UnknownTable,
                &format!("no table named {table}"),
            ),
            Some(tid) => match st.move_tablet(tid, *tablet_index as usize, *server_id) {
                Ok(()) => ok(out, id, &Response::Done),
                Err((s, m)) => err(out, id, s, &m),
            },
        },
        _ => err(out, id, Status::BadRequest, "not a coordinator request"),
    };
    (Action::Reply, status)
}

/// A fake coordinator plus its shards.
pub struct FakeCluster {
    /// Where the fake coordinator listens.
    pub coord_addr: String,
    /// The coordinator's state, shared with its connection tasks.
    pub coord: Arc<Mutex<CoordState>>,
    /// The shards, server ids 1..=n.
    pub shards: Vec<FakeShard>,
    /// The coordinator's listener and connection tasks, aborted on drop.
    coord_tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl FakeCluster {
    pub async fn start(n_shards: usize) -> FakeCluster {
        let mut shards = Vec::new();
        for i in 0..n_shards {
            shards.push(FakeShard::start(i as u64 + 1).await);
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let coord_addr = listener.local_addr().unwrap().to_string();
        let coord = Arc::new(Mutex::new(CoordState {
            tables: Vec::new(),
            map_version: 1,
            next_table_id: 0,
            shards: shards
                .iter()
                .map(|s| (s.server_id, s.addr.clone(), s.state.clone()))
                .collect(),
            log: Vec::new(),
        }));
        let coord_tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let listen = tokio::spawn(serve(
            listener,
            coord.clone(),
            coord_tasks.clone(),
            coord_handle,
            |s: &mut CoordState, l| s.log.push(l),
        ));
        coord_tasks.lock().unwrap().push(listen.abort_handle());
        FakeCluster {
            coord_addr,
            coord,
            shards,
            coord_tasks,
        }
    }

    pub fn co(&self) -> std::sync::MutexGuard<'_, CoordState> {
        self.coord.lock().unwrap()
    }

    /// Move a tablet behind the client's back (the client's cached map goes stale).
    pub fn move_tablet(&self, table: u64, index: usize, server_id: u64) {
        self.co().move_tablet(table, index, server_id).unwrap();
    }

    /// How many `op` requests each shard has received, by shard index.
    pub fn counts(&self, op: &str) -> Vec<usize> {
        self.shards.iter().map(|s| s.st().count(op)).collect()
    }

    /// The shard that stores `key` of `table`, by looking at the data.
    pub fn holder(&self, table: u64, key: &[u8]) -> Option<usize> {
        self.shards
            .iter()
            .position(|s| s.st().data.contains_key(&(table, key.to_vec())))
    }

    /// The tablet range of `table` containing `hash`, per the coordinator.
    pub fn tablet_of(&self, table: u64, hash: u64) -> (usize, TabletInfo) {
        let co = self.co();
        let info = co.tables.iter().find(|t| t.id == table).unwrap();
        let i = info
            .tablets
            .iter()
            .position(|t| t.start_hash <= hash && hash <= t.end_hash)
            .unwrap();
        (i, info.tablets[i].clone())
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        for t in self.coord_tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}
