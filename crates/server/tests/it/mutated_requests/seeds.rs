//! The valid requests the mutants start from: one of every kind a shard,
//! a backup port or the coordinator takes, naming the attack tables, and
//! what the test needs to know of a request (its port, whether it is a
//! control request, which tables it names).

use bytes::BytesMut;
use insitu_protocol::frame::HEADER_BYTES;
use insitu_protocol::plan::{CmpOp, Field, Op, PredOp, ScanPlan, UpdateAction};
use insitu_protocol::query::{
    AggFunc, AggSpec, IndexProbe, Pred, QueryOutput, QueryPlan, Scalar, SortKey, ValueOp,
};
use insitu_protocol::txn::{TxnAnchor, TxnItem, TxnWrite};
use insitu_protocol::{
    BackupOp, Destination, Number, Object, RejectRules, Request, SideRecord, TabletState, blob,
    encode_request,
};

/// Where a mutant goes: the port that serves its kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Port {
    Shard,
    Backup,
    Coordinator,
}

impl Port {
    /// The port that serves `request`'s kind.
    pub fn of(request: &Request<'_>) -> Port {
        match request.destination() {
            Destination::Shard => Port::Shard,
            Destination::Backup => Port::Backup,
            Destination::Coordinator => Port::Coordinator,
        }
    }
}

/// One valid request, encoded (body only), and the port it is for.
pub struct Seed {
    pub body: Vec<u8>,
    pub port: Port,
    /// `is_control` of the request: sent in the second part only.
    pub control: bool,
}

pub fn body_of(request: &Request<'_>) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode_request(&mut out, 1, request).expect("a seed request encodes");
    out[HEADER_BYTES..].to_vec()
}

/// Whether a request changes which tablets a shard holds or how it
/// replicates (the coordinator's requests), or deletes replicas: the test's
/// first part sends none, so its data requests meet the tablets as set up;
/// the second part sends them too.
pub fn is_control(request: &Request<'_>) -> bool {
    use Request::*;
    matches!(
        request,
        TakeTablet { .. }
            | DropTablet { .. }
            | MigrateTablet { .. }
            | ActivateTablet { .. }
            | RecoverTablet { .. }
            | ServerDown { .. }
            | MarkLost { .. }
            | BackupForget { .. }
            | Enlist { .. }
            | RemoveServer { .. }
            | MoveTablet { .. }
            | DropTable { .. }
            | AcceptLoss { .. }
    )
}

/// Whether a request may not be sent at all, though it names no table by
/// id: it names the canary table by name, or would take the one real server
/// out of the cluster (`RemoveServer` of it, or an `Enlist` claiming its
/// addresses), which removes every table's data by design.
pub fn spares_nothing(
    request: &Request<'_>,
    canary: &str,
    server_id: u64,
    real_addrs: &[String],
) -> bool {
    use Request::*;
    match request {
        DropTable { name }
        | OpenTable { name }
        | AckLoss { table: name }
        | AcceptLoss { table: name } => name == canary,
        CreateIndex { table, .. } | DropIndex { table, .. } | MoveTablet { table, .. } => {
            table == canary
        }
        RemoveServer { server_id: id } => *id == server_id,
        Enlist {
            shard_addrs,
            backup_addr,
            ..
        } => shard_addrs
            .iter()
            .chain(std::iter::once(backup_addr))
            .any(|a| real_addrs.contains(a)),
        _ => false,
    }
}

/// The receiving copy the `MigrateBatch` seeds write into: a tablet of a
/// table the coordinator never made (`attack`'s id + 1000), taken by the
/// first shard as a move's destination.
pub fn receiving(attack: u64) -> Request<'static> {
    Request::TakeTablet {
        table: attack + 1000,
        start_hash: 0,
        end_hash: u64::MAX,
        map_version: 9,
        state: TabletState::Receiving,
        migration: 5,
    }
}

/// The table a request names, if any (checked against the canary's id).
pub fn tables_named(request: &Request<'_>) -> Vec<u64> {
    use Request::*;
    match request {
        Read { table, .. }
        | Write { table, .. }
        | Remove { table, .. }
        | Increment { table, .. }
        | MultiRead { table, .. }
        | MultiWrite { table, .. }
        | MultiRemove { table, .. }
        | Enumerate { table, .. }
        | TakeTablet { table, .. }
        | DropTablet { table, .. }
        | MigrateTablet { table, .. }
        | MigrateBatch { table, .. }
        | ActivateTablet { table, .. }
        | RecoverTablet { table, .. }
        | TableMap { table }
        | Scan { table, .. }
        | Query { table, .. }
        | SnapshotRead { table, .. }
        | MarkLost { table, .. } => vec![*table],
        TxnPrepare {
            primary,
            others,
            items,
            ..
        } => primary
            .iter()
            .chain(others.iter())
            .map(|a| a.table)
            .chain(items.iter().map(|i| i.table))
            .collect(),
        TxnResolve { anchor, .. } | TxnInquire { anchor, .. } => vec![anchor.table],
        BackupWrite { ops, .. } => ops
            .iter()
            .filter_map(|op| match op {
                BackupOp::Append { table, .. } => Some(*table),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Valid requests of every kind, naming the attack tables.
pub fn seeds(
    attack: &insitu_protocol::TableInfo,
    typed: &insitu_protocol::TableInfo,
    schema: &insitu_protocol::schema::Schema,
    cluster: u64,
    backup_addr: &str,
    server_id: u64,
) -> Vec<Seed> {
    let t = attack.id;
    let tab = &attack.tablets[0];
    let ty = &typed.tablets[0];
    let key = blob(b"a1");
    let anchor = |k: &'static [u8]| TxnAnchor {
        table: t,
        key: blob(k),
    };
    let rules = RejectRules {
        exists: false,
        doesnt_exist: false,
        version_le_given: true,
        version_ne_given: false,
        given_version: 3,
    };
    let scan = |op: Op, filter: Vec<PredOp>, snapshot_ts: u64, op_id: u64| Request::Scan {
        table: t,
        start_hash: tab.start_hash,
        end_hash: tab.end_hash,
        map_version: tab.map_version,
        plan: ScanPlan {
            filter,
            ..ScanPlan::new(op)
        },
        op_id,
        budget_ms: 1000,
        snapshot_ts,
    };
    let query = |plan: QueryPlan, index: Option<IndexProbe>, snapshot_ts: u64| Request::Query {
        table: typed.id,
        start_hash: ty.start_hash,
        end_hash: ty.end_hash,
        map_version: ty.map_version,
        schema: schema.clone(),
        plan,
        resume: None,
        index,
        snapshot_ts,
    };
    let filter = vec![Pred::Cmp {
        col: 2,
        op: CmpOp::Gt,
        value: Scalar::Float(0.5),
    }];
    let shard = vec![
        Request::Ping,
        Request::Read { table: t, key },
        Request::Write {
            table: t,
            key,
            value: blob(&[7u8; 24]),
            rules,
            expires_at_ms: 0,
        },
        Request::Remove {
            table: t,
            key: blob(b"a2"),
            rules,
        },
        Request::Increment {
            table: t,
            key: blob(b"n"),
            delta: Number::I64(3),
            rules: RejectRules::default(),
        },
        Request::MultiRead {
            table: t,
            keys: vec![key, blob(b"a3"), blob(b"")],
        },
        Request::MultiWrite {
            table: t,
            items: vec![(key, blob(b"x")), (blob(b"a4"), blob(&[1u8; 16]))],
        },
        Request::MultiRemove {
            table: t,
            keys: vec![blob(b"a5"), blob(b"a6")],
        },
        Request::Enumerate {
            table: t,
            tablet_start: tab.start_hash,
            from_hash: 17,
            max_bytes: 4096,
        },
        Request::ShardStats {
            reset_longest_call: true,
        },
        receiving(t),
        Request::DropTablet {
            table: t,
            start_hash: attack.tablets[1].start_hash,
            only_if_not_serving: true,
        },
        Request::MigrateTablet {
            table: t,
            start_hash: attack.tablets[2].start_hash,
            dest_addr: "127.0.0.1:9".into(),
            migration: 5,
        },
        // Into the receiving copy the test set up (`receiving`).
        Request::MigrateBatch {
            table: t + 1000,
            start_hash: 0,
            migration: 5,
            next_version: 100,
            commit_ts_bound: Some(4),
            objects: vec![Object {
                key,
                value: blob(b"moved"),
                version: 9,
                expires_at_ms: 0,
            }],
            records: vec![SideRecord {
                class: 1,
                id: 77,
                anchor: key,
                payload: blob(&[2, 0, 1, 97, 49, 0, 0, 0]),
            }],
        },
        Request::ActivateTablet {
            table: t,
            start_hash: tab.start_hash,
            map_version: tab.map_version + 1,
            writes: true,
        },
        Request::RecoverTablet {
            table: t + 2000,
            start_hash: 0,
            end_hash: u64::MAX,
            map_version: 3,
            master: 4242,
            backups: vec![backup_addr.to_string()],
            accept_missing: false,
        },
        Request::ServerDown { server_id: 4242 },
        scan(Op::Count, Vec::new(), 0, 0),
        scan(
            Op::Aggregate {
                field: Field::I64(8),
            },
            vec![PredOp::Cmp {
                field: Field::I32(0),
                op: CmpOp::Ge,
                value: Number::I64(1),
            }],
            0,
            0,
        ),
        scan(
            Op::Update {
                field: Field::I64(0),
                action: UpdateAction::Add(Number::I64(1)),
            },
            Vec::new(),
            0,
            31,
        ),
        scan(Op::Count, Vec::new(), 1, 0),
        query(
            QueryPlan {
                filter: filter.clone(),
                output: QueryOutput::Rows {
                    columns: vec![0, 1, 2],
                    order_by: vec![SortKey {
                        col: 2,
                        descending: true,
                        nulls_first: false,
                    }],
                    limit: Some(5),
                },
            },
            None,
            0,
        ),
        query(
            QueryPlan {
                filter: Vec::new(),
                output: QueryOutput::Aggregate {
                    group_by: vec![1],
                    aggs: vec![
                        AggSpec {
                            func: AggFunc::CountStar,
                            arg: Vec::new(),
                        },
                        AggSpec {
                            func: AggFunc::Sum,
                            arg: vec![ValueOp::Col(2), ValueOp::Col(0), ValueOp::Mul],
                        },
                    ],
                },
            },
            Some(IndexProbe::Eq {
                col: 0,
                values: vec![Scalar::Int(3)],
            }),
            0,
        ),
        Request::TxnPrepare {
            txn: 0xABCD_0001,
            primary: None,
            others: vec![anchor(b"zz")],
            items: vec![
                TxnItem {
                    table: t,
                    key: blob(b"a7"),
                    read_version: Some(0),
                    write: TxnWrite::Put(blob(b"tx")),
                },
                TxnItem {
                    table: t,
                    key: blob(b"a8"),
                    read_version: None,
                    write: TxnWrite::Remove,
                },
            ],
            writes: true,
        },
        Request::TxnPrepare {
            txn: 0xABCD_0002,
            primary: Some(anchor(b"a9")),
            others: Vec::new(),
            items: vec![TxnItem {
                table: t,
                key: blob(b"b1"),
                read_version: None,
                write: TxnWrite::PutExpiring {
                    value: blob(b"e"),
                    expires_at_ms: 1,
                },
            }],
            writes: true,
        },
        Request::TxnDecide {
            txn: 0xABCD_0001,
            commit: true,
            commit_ts: 0,
            direct: true,
        },
        Request::TxnResolve {
            txn: 0xABCD_0002,
            anchor: anchor(b"a9"),
        },
        Request::TxnInquire {
            txn: 0xABCD_0001,
            anchor: anchor(b"a7"),
            part: false,
        },
        Request::TxnInquire {
            txn: 0xABCD_0003,
            anchor: anchor(b"a8"),
            part: true,
        },
        Request::SnapshotRead {
            table: t,
            snapshot_ts: 2,
            keys: vec![key, blob(b"a3")],
        },
        Request::MarkLost {
            table: t,
            start_hash: attack.tablets[3].start_hash,
            lost_from: 4242,
            version_floor: 1000,
        },
    ];
    let backup = [
        Request::BackupWrite {
            cluster,
            master: 4242,
            ops: vec![
                BackupOp::Append {
                    log: 3,
                    table: t + 3000,
                    start_hash: 0,
                    segment: 1,
                    offset: 0,
                    bytes: blob(&[5u8; 64]),
                    close: false,
                },
                BackupOp::Digest {
                    log: 3,
                    segment: 1,
                    seq: 1,
                    segments: vec![1, 2],
                },
                BackupOp::Free { log: 3, segment: 2 },
            ],
        },
        Request::BackupList {
            cluster,
            master: 4242,
            fence: false,
        },
        Request::BackupRead {
            cluster,
            master: 4242,
            log: 3,
            segment: 1,
            offset: 0,
            max_bytes: 1 << 16,
        },
        Request::BackupForget {
            cluster,
            master: 4243,
        },
    ];
    let coordinator = vec![
        Request::Enlist {
            shard_addrs: vec!["127.0.0.1:9".into()],
            identity: "mutant".into(),
            replace: false,
            backup_addr: String::new(),
        },
        Request::RemoveServer { server_id: 4242 },
        Request::CreateTable {
            name: "made".into(),
            tablets: 3,
            schema: Some(
                insitu_rows::text::parse_schema(
                    "id int64, d decimal(15,2), day date32, s utf8, b bool, i int32 not null, f float64",
                    "id,s",
                )
                .expect("a valid schema"),
            ),
            by_slot: false,
        },
        Request::CreateTable {
            name: "slots".into(),
            tablets: 2,
            schema: None,
            by_slot: true,
        },
        Request::DropTable {
            name: "made".into(),
        },
        Request::CreateIndex {
            table: "rows".into(),
            column: "score".into(),
        },
        Request::DropIndex {
            table: "rows".into(),
            column: "score".into(),
        },
        Request::OpenTable {
            name: "attack".into(),
        },
        Request::TableMap { table: t },
        Request::ListTables,
        Request::ListServers,
        Request::MoveTablet {
            table: "attack".into(),
            tablet_index: 1,
            server_id,
        },
        Request::Timestamps { count: 3 },
        Request::AckLoss {
            table: "attack".into(),
        },
        Request::AcceptLoss {
            table: "attack".into(),
        },
    ];
    let seed = |port| {
        move |r: &Request<'_>| Seed {
            body: body_of(r),
            port,
            control: is_control(r),
        }
    };
    shard
        .iter()
        .map(seed(Port::Shard))
        .chain(backup.iter().map(seed(Port::Backup)))
        .chain(coordinator.iter().map(seed(Port::Coordinator)))
        .collect()
}
