//! Fake insitu servers for the client's tests: a coordinator and storage
//! shards speaking the real wire protocol over loopback TCP, backed by
//! `BTreeMap`s, with knobs to inject the faults the client must survive.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use futures::StreamExt;
use insitu_keyhash::{HashRange, key_hash};
use insitu_protocol::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tokio_util::codec::FramedRead;

/// One request a fake server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Request variant name, e.g. "MultiWrite".
    pub op: &'static str,
    /// Keys / items in a multi-request (1 for point requests).
    pub items: usize,
    /// Encoded body bytes of the request.
    pub body_len: usize,
    /// Status of the reply header that was sent (Ok for dropped / hung requests).
    pub status: Status,
}

fn op_name(r: &Request<'_>) -> &'static str {
    match r {
        Request::Ping => "Ping",
        Request::Read { .. } => "Read",
        Request::Write { .. } => "Write",
        Request::Remove { .. } => "Remove",
        Request::Increment { .. } => "Increment",
        Request::MultiRead { .. } => "MultiRead",
        Request::MultiWrite { .. } => "MultiWrite",
        Request::MultiRemove { .. } => "MultiRemove",
        Request::Enumerate { .. } => "Enumerate",
        Request::ShardStats => "ShardStats",
        Request::OpenTable { .. } => "OpenTable",
        Request::TableMap { .. } => "TableMap",
        Request::CreateTable { .. } => "CreateTable",
        Request::DropTable { .. } => "DropTable",
        Request::CreateIndex { .. } => "CreateIndex",
        Request::DropIndex { .. } => "DropIndex",
        Request::ListTables => "ListTables",
        Request::ListServers => "ListServers",
        Request::MoveTablet { .. } => "MoveTablet",
        _ => "Other",
    }
}

fn item_count(r: &Request<'_>) -> usize {
    match r {
        Request::MultiRead { keys, .. } | Request::MultiRemove { keys, .. } => keys.len(),
        Request::MultiWrite { items, .. } => items.len(),
        _ => 1,
    }
}

/// A stored object.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// The object's bytes.
    pub value: Vec<u8>,
    /// Its version, from the shard's counter.
    pub version: u64,
}

/// What a fake shard holds, and its fault-injection knobs.
#[derive(Default)]
pub struct ShardState {
    /// Owned tablets: (table, range).
    pub tablets: Vec<(u64, HashRange)>,
    /// Objects by (table, key).
    pub data: BTreeMap<(u64, Vec<u8>), Stored>,
    /// Last version handed out.
    pub version: u64,
    /// Every request received, in order.
    pub log: Vec<Logged>,
    /// Answer `Status::Retry` to the next N data requests.
    pub retry_next: usize,
    /// Answer `Status::Retry` to every data request.
    pub retry_always: bool,
    /// MultiRead: answer only the first ceil(n/2) keys, `Truncated` for the rest.
    pub truncate_half: bool,
    /// Apply the next N data requests, then close the connection without replying.
    pub drop_after_apply_next: usize,
    /// Never answer data requests.
    pub hang: bool,
    /// Most objects per Enumerate reply.
    pub enumerate_max_objects: usize,
    /// Enumerate: answer no objects and "continue from where you asked" (no progress).
    pub enumerate_stall: bool,
}

impl ShardState {
    fn owns(&self, table: u64, key: &[u8]) -> bool {
        let h = key_hash(table, key);
        self.tablets
            .iter()
            .any(|(t, r)| *t == table && r.contains(h))
    }

    fn next_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// Objects of `table` whose hash lies in `range`.
    pub fn keys_in(&self, table: u64, range: HashRange) -> Vec<Vec<u8>> {
        self.data
            .keys()
            .filter(|(t, k)| *t == table && range.contains(key_hash(table, k)))
            .map(|(_, k)| k.clone())
            .collect()
    }

    pub fn count(&self, op: &str) -> usize {
        self.log.iter().filter(|l| l.op == op).count()
    }

    /// Store `value` under a new version; returns the version.
    fn store(&mut self, table: u64, key: &[u8], value: Vec<u8>) -> u64 {
        let version = self.next_version();
        self.data
            .insert((table, key.to_vec()), Stored { value, version });
        version
    }

    /// Whether a single-object change may go ahead: this shard owns the key
    /// and `rules` let it through; else the error status and message.
    fn may_change(
        &self,
        table: u64,
        key: &[u8],
        rules: &RejectRules,
    ) -> Result<(), (Status, String)> {
        if !self.owns(table, key) {
            return Err((Status::UnknownTablet, "not my tablet".into()));
        }
        self.check_rules(table, key, rules)
    }

    fn check_rules(
        &self,
        table: u64,
        key: &[u8],
        rules: &RejectRules,
    ) -> Result<(), (Status, String)> {
        let cur = self.data.get(&(table, key.to_vec()));
        match cur {
            Some(o) if rules.exists => Err((
                Status::ObjectExists,
                format!("object exists (version {})", o.version),
            )),
            None if rules.doesnt_exist => {
                Err((Status::ObjectDoesntExist, "object does not exist".into()))
            }
            Some(o) if rules.version_ne_given && o.version != rules.given_version => Err((
                Status::WrongVersion,
                format!("version check failed (current version {})", o.version),
            )),
            Some(o) if rules.version_le_given && o.version <= rules.given_version => Err((
                Status::WrongVersion,
                format!("version check failed (current version {})", o.version),
            )),
            _ => Ok(()),
        }
    }
}

enum Action {
    Reply,
    Close,
    Hang,
}

fn is_data(r: &Request<'_>) -> bool {
    matches!(
        r,
        Request::Read { .. }
            | Request::Write { .. }
            | Request::Remove { .. }
            | Request::Increment { .. }
            | Request::MultiRead { .. }
            | Request::MultiWrite { .. }
            | Request::MultiRemove { .. }
            | Request::Enumerate { .. }
    )
}

fn write_result(status: Status, version: u64) -> WriteResult {
    WriteResult { status, version }
}

fn ok(out: &mut BytesMut, id: u64, r: &Response<'_>) -> Status {
    encode_response(out, id, Status::Ok, r).expect("fake reply fits");
    Status::Ok
}

fn err(out: &mut BytesMut, id: u64, s: Status, msg: &str) -> Status {
    encode_error(out, id, s, msg);
    s
}

fn shard_handle(
    st: &mut ShardState,
    req: &Request<'_>,
    id: u64,
    out: &mut BytesMut,
) -> (Action, Status) {
    if is_data(req) {
        if st.hang {
            return (Action::Hang, Status::Ok);
        }
        if st.retry_always || st.retry_next > 0 {
            st.retry_next = st.retry_next.saturating_sub(1);
            return (
                Action::Reply,
                err(out, id, Status::Retry, "tablet is moving"),
            );
        }
    }
    let status = match req {
        Request::Ping => ok(out, id, &Response::Pong),
        Request::Read { table, key } => {
            if !st.owns(*table, key) {
                err(out, id, Status::UnknownTablet, "not my tablet")
            } else if let Some(o) = st.data.get(&(*table, key.to_vec())) {
                ok(
                    out,
                    id,
                    &Response::Read {
                        version: o.version,
                        value: blob(&o.value),
                    },
                )
            } else {
                err(out, id, Status::ObjectDoesntExist, "no such object")
            }
        }
        Request::Write {
            table,
            key,
            value,
            rules,
        } => {
            if let Err((s, m)) = st.may_change(*table, key, rules) {
                err(out, id, s, &m)
            } else {
                let version = st.store(*table, key, value.to_vec());
                ok(out, id, &Response::Written { version })
            }
        }
        Request::Remove { table, key, rules } => {
            if let Err((s, m)) = st.may_change(*table, key, rules) {
                err(out, id, s, &m)
            } else if let Some(o) = st.data.remove(&(*table, key.to_vec())) {
                ok(out, id, &Response::Removed { version: o.version })
            } else {
                err(out, id, Status::ObjectDoesntExist, "no such object")
            }
        }
        Request::Increment {
            table,
            key,
            delta,
            rules,
        } => {
            if let Err((s, m)) = st.may_change(*table, key, rules) {
                err(out, id, s, &m)
            } else {
                let cur = st
                    .data
                    .get(&(*table, key.to_vec()))
                    .map(|o| o.value.clone())
                    .unwrap_or_else(|| vec![0; 8]);
                match <[u8; 8]>::try_from(cur.as_slice()) {
                    Err(_) => err(out, id, Status::NotANumber, "not 8 bytes"),
                    Ok(bytes) => {
                        let (new, value) = match delta {
                            Number::I64(d) => {
                                let v = i64::from_le_bytes(bytes) + d;
                                (v.to_le_bytes(), Number::I64(v))
                            }
                            Number::F64(d) => {
                                let v = f64::from_le_bytes(bytes) + d;
                                (v.to_le_bytes(), Number::F64(v))
                            }
                        };
                        let version = st.store(*table, key, new.to_vec());
                        ok(out, id, &Response::Incremented { value, version })
                    }
                }
            }
        }
        Request::MultiRead { table, keys } => {
            let answer = if st.truncate_half {
                keys.len().div_ceil(2)
            } else {
                keys.len()
            };
            let results: Vec<ReadResult<'_>> = keys
                .iter()
                .enumerate()
                .map(|(i, key)| {
                    let none = |status| ReadResult {
                        status,
                        version: 0,
                        value: blob(&[]),
                    };
                    if i >= answer {
                        none(Status::Truncated)
                    } else if !st.owns(*table, key) {
                        none(Status::UnknownTablet)
                    } else if let Some(o) = st.data.get(&(*table, key.to_vec())) {
                        ReadResult {
                            status: Status::Ok,
                            version: o.version,
                            value: blob(&o.value),
                        }
                    } else {
                        none(Status::ObjectDoesntExist)
                    }
                })
                .collect();
            ok(out, id, &Response::MultiRead { results })
        }
        Request::MultiWrite { table, items } => {
            let mut results = Vec::new();
            for (key, value) in items {
                results.push(if !st.owns(*table, key) {
                    write_result(Status::UnknownTablet, 0)
                } else {
                    write_result(Status::Ok, st.store(*table, key, value.to_vec()))
                });
            }
            ok(out, id, &Response::MultiWrite { results })
        }
        Request::MultiRemove { table, keys } => {
            let mut results = Vec::new();
            for key in keys {
                results.push(if !st.owns(*table, key) {
                    write_result(Status::UnknownTablet, 0)
                } else if let Some(o) = st.data.remove(&(*table, key.to_vec())) {
                    write_result(Status::Ok, o.version)
                } else {
                    write_result(Status::ObjectDoesntExist, 0)
                });
            }
            ok(out, id, &Response::MultiRemove { results })
        }
        Request::Enumerate {
            table,
            tablet_start,
            from_hash,
            max_bytes,
        } => {
            let Some(range) = st
                .tablets
                .iter()
                .find(|(t, r)| t == table && r.start == *tablet_start)
                .map(|(_, r)| *r)
            else {
                return (
                    Action::Reply,
                    err(out, id, Status::UnknownTablet, "not my tablet"),
                );
            };
            if st.enumerate_stall {
                return (
                    Action::Reply,
                    ok(
                        out,
                        id,
                        &Response::Enumerate {
                            objects: Vec::new(),
                            next_hash: Some(*from_hash),
                        },
                    ),
                );
            }
            let mut objs: Vec<(u64, &Vec<u8>, &Stored)> = st
                .data
                .iter()
                .filter(|((t, k), _)| {
                    t == table && range.contains(key_hash(*t, k)) && key_hash(*t, k) >= *from_hash
                })
                .map(|((t, k), o)| (key_hash(*t, k), k, o))
                .collect();
            objs.sort_by_key(|(h, _, _)| *h);
            let limit = if st.enumerate_max_objects == 0 {
                usize::MAX
            } else {
                st.enumerate_max_objects
            };
            let mut objects = Vec::new();
            let mut bytes = 0usize;
            let mut next_hash = None;
            for (h, k, o) in &objs {
                if objects.len() >= limit || (bytes >= *max_bytes as usize && !objects.is_empty()) {
                    next_hash = Some(*h);
                    break;
                }
                bytes += k.len() + o.value.len();
                objects.push(Object {
                    key: blob(k),
                    value: blob(&o.value),
                    version: o.version,
                });
            }
            ok(out, id, &Response::Enumerate { objects, next_hash })
        }
        Request::ShardStats => {
            let tablets = st
                .tablets
                .iter()
                .map(|(t, r)| TabletStat {
                    table: *t,
                    start_hash: r.start,
                    end_hash: r.end,
                    objects: st.keys_in(*t, *r).len() as u64,
                    live_bytes: 0,
                    segment_bytes: 0,
                })
                .collect();
            ok(
                out,
                id,
                &Response::ShardStats(ShardStats {
                    tablets,
                    memory_budget_bytes: 1 << 30,
                    segment_bytes: 0,
                    live_bytes: 0,
                    requests: 0,
                }),
            )
        }
        _ => err(out, id, Status::BadRequest, "not a shard request"),
    };
    if is_data(req) && st.drop_after_apply_next > 0 {
        st.drop_after_apply_next -= 1;
        out.clear();
        return (Action::Close, Status::Ok);
    }
    (Action::Reply, status)
}

/// Accept connections on `listener`, answering every frame with `handle`.
async fn serve<S: Send + 'static>(
    listener: TcpListener,
    state: Arc<Mutex<S>>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
    handle: fn(&mut S, &Request<'_>, u64, &mut BytesMut) -> (Action, Status),
    log: fn(&mut S, Logged),
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let state = state.clone();
        let conn = tokio::spawn(async move {
            let (read_half, mut write_half) = stream.into_split();
            let mut frames = FramedRead::new(read_half, FrameCodec::default());
            while let Some(Ok(frame)) = frames.next().await {
                let mut out = BytesMut::new();
                let action = {
                    let Ok(req) = decode_request(&frame.body) else {
                        return;
                    };
                    let mut st = state.lock().unwrap();
                    let (action, status) = handle(&mut st, &req, frame.header.request_id, &mut out);
                    log(
                        &mut st,
                        Logged {
                            op: op_name(&req),
                            items: item_count(&req),
                            body_len: frame.body.len(),
                            status,
                        },
                    );
                    action
                };
                match action {
                    Action::Reply => {
                        if write_half.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                    Action::Close => return,
                    Action::Hang => {}
                }
            }
        });
        tasks.lock().unwrap().push(conn.abort_handle());
    }
}

/// A fake storage shard.
pub struct FakeShard {
    /// Where it listens ("127.0.0.1:port").
    pub addr: String,
    /// The id the fake coordinator lists it under (one shard per server).
    pub server_id: u64,
    /// Its data and knobs, shared with the connection tasks and the coordinator.
    pub state: Arc<Mutex<ShardState>>,
    /// Listener and connection tasks, aborted by `kill`.
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl FakeShard {
    pub async fn start(server_id: u64) -> FakeShard {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(ShardState {
            enumerate_max_objects: 0,
            ..Default::default()
        }));
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let listen = tokio::spawn(serve(
            listener,
            state.clone(),
            tasks.clone(),
            shard_handle,
            |s: &mut ShardState, l| s.log.push(l),
        ));
        tasks.lock().unwrap().push(listen.abort_handle());
        FakeShard {
            addr,
            server_id,
            state,
            tasks,
        }
    }

    pub fn st(&self) -> std::sync::MutexGuard<'_, ShardState> {
        self.state.lock().unwrap()
    }

    /// Stop listening and close every connection.
    pub fn kill(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Drop for FakeShard {
    fn drop(&mut self) {
        self.kill();
    }
}

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

    /// The shard that stores `key` of `table`, by looking at the data.
    /// How many `op` requests each shard has received, by shard index.
    pub fn counts(&self, op: &str) -> Vec<usize> {
        self.shards.iter().map(|s| s.st().count(op)).collect()
    }

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
