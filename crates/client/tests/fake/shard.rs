//! A fake storage shard: its objects, tablets and fault knobs, and how it
//! answers each data request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use insitu_keyhash::{HashRange, key_hash};
use insitu_protocol::*;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

use super::{Action, Logged, err, ok, serve};

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

fn is_data(r: &Request<'_>) -> bool {
    r.is_point() || matches!(r, Request::Enumerate { .. })
}

fn write_result(status: Status, version: u64) -> WriteResult {
    WriteResult { status, version }
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
                        expires_at_ms: 0,
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
            ..
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
                    expires_at_ms: 0,
                });
            }
            ok(out, id, &Response::Enumerate { objects, next_hash })
        }
        Request::ShardStats { .. } => {
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
                    // The fake keeps no deadlines.
                    expiring_objects: 0,
                    expiring_deadline_sum_ms: 0,
                    // Nor any side record.
                    records: 0,
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
                    longest_point_call_us: 0,
                    resp_port: 0,
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
