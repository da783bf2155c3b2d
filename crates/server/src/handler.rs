//! Request dispatch: decode, pass the gate, hand each request to its handler
//! (single-key ones in `point.rs`), encode the reply into the connection's
//! output buffer; and the admission and reply helpers every handler shares.

use bytes::BytesMut;
use insitu_engine::{EngineError, key_hash};
use insitu_protocol::{
    Destination, RejectRules, Request, Response, Status, decode_request, encode_error,
    encode_response, frame::check_header,
};

use insitu_auth::{Admission, Session};

use crate::shard::ShardState;
use crate::stamped_batch::Batch;

/// Bytes kept free in a reply for framing and per-entry overhead.
pub(crate) const REPLY_SLACK_BYTES: usize = 64 * 1024;
/// Most items one multi-operation request may carry.
pub use insitu_protocol::MAX_MULTI_ITEMS;

/// The refusal of a metadata request sent to a shard: names where it belongs.
const FOR_COORDINATOR: &str = "this is a storage server; send metadata requests to the coordinator";
/// The refusal of a backup request sent to a shard port: names where it belongs.
const FOR_BACKUP: &str =
    "this is a shard port; send backup requests to the server's backup address";

pub fn engine_status(e: &EngineError) -> Status {
    match e {
        EngineError::UnknownTablet => Status::UnknownTablet,
        EngineError::OutOfMemory => Status::OutOfMemory,
        EngineError::KeyTooLarge { .. } => Status::KeyTooLarge,
        EngineError::ValueTooLarge { .. } => Status::ValueTooLarge,
        EngineError::EmptyKey => Status::EmptyKey,
        EngineError::ObjectExists { .. } => Status::ObjectExists,
        EngineError::ObjectDoesntExist => Status::ObjectDoesntExist,
        EngineError::WrongVersion { .. } => Status::WrongVersion,
        EngineError::NotANumber { .. } => Status::NotANumber,
        EngineError::BadTablet(_) => Status::BadRequest,
        // Room held for transaction decisions about to be applied: gone
        // within a round trip or two.
        EngineError::HeadPromised { .. } => Status::Retry,
        // The protocol has no status of its own for this; the message says
        // which version and that the tablet's counter is spent.
        EngineError::VersionExhausted { .. } => Status::Internal,
    }
}

/// The engine's form of a request's reject rules (the Redis port's
/// conditions become these too, `resp/store.rs`).
pub(crate) fn rules(r: &RejectRules) -> insitu_engine::RejectRules {
    insitu_engine::RejectRules {
        exists: r.exists,
        doesnt_exist: r.doesnt_exist,
        version_le_given: r.version_le_given,
        version_ne_given: r.version_ne_given,
        given_version: r.given_version,
    }
}

/// Whether this shard may serve `key` of `table` now. Ok(()) to go on.
#[inline]
pub(crate) fn admit(state: &ShardState, table: u64, key: &[u8], write: bool) -> Result<(), Status> {
    // A key a prepared transaction will write waits for its decision.
    if write && state.txns.is_locked(table, key) {
        return Err(Status::Retry);
    }
    admit_tablet(state, table, key, write)
}

/// `admit` without the lock check: whether the key's tablet serves here (a
/// transaction's prepare checks locks itself, refusing with `Conflict`).
#[inline]
pub(crate) fn admit_tablet(
    state: &ShardState,
    table: u64,
    key: &[u8],
    write: bool,
) -> Result<(), Status> {
    if state.unusual_tablets.get() == 0 {
        return Ok(()); // every tablet here is plainly serving; the engine answers UnknownTablet itself
    }
    let hash = key_hash(table, key);
    let engine = state.engine.borrow();
    let Some(range) = engine.tablet_for(table, hash) else {
        return Err(Status::UnknownTablet);
    };
    match state.tablets.borrow().get(&(table, range.start)) {
        Some(m) => m.refusal(write).map_or(Ok(()), Err),
        None => Err(Status::UnknownTablet),
    }
}

pub(crate) fn reply_engine_error(out: &mut BytesMut, id: u64, e: &EngineError) {
    encode_error(out, id, engine_status(e), e.to_string());
}

/// Encode `response` as the Ok reply to request `id` (an Internal error if it
/// cannot be encoded).
pub(crate) fn reply(out: &mut BytesMut, id: u64, response: &Response<'_>) {
    if let Err(e) = encode_response(out, id, Status::Ok, response) {
        encode_error(
            out,
            id,
            Status::Internal,
            format!("cannot encode reply: {e}"),
        );
    }
}

/// Reply with `result`'s response, or with the status and message it was
/// refused with: the tail every request whose handler refuses with a
/// `(Status, String)` shares, so all refusals are encoded alike.
pub(crate) fn reply_or_refuse(
    out: &mut BytesMut,
    id: u64,
    result: Result<Response<'_>, (Status, String)>,
) {
    match result {
        Ok(response) => reply(out, id, &response),
        Err((status, message)) => encode_error(out, id, status, message),
    }
}

/// What `handle` tells the connection loop about one request frame.
pub struct Handled {
    /// The engine's log mark (`Engine::log_changes` values) R backups must
    /// hold before the reply leaves (`conn.rs`), since the reply may show
    /// what was logged up to it; 0: the reply shows nothing. Every request
    /// but the coordinator's tablet administration takes the changes made
    /// by the time it was answered; that administration must not wait (a
    /// server's first `TakeTablet` comes before it knows its cluster and R)
    /// and exposes nothing (a new tablet is empty until clients write to
    /// it). A found object of a point read takes only its segment's mark
    /// (`Engine::read_held`): a read of an old object does not queue behind
    /// the replication of a long update's writes.
    pub need: u64,
    /// Close the connection after the reply (failed authentication).
    pub close: bool,
}

/// Handle one request frame: decode it, pass it through the server's
/// authentication gate (`session` is the connection's state there), serve it.
/// A plain single-key write while snapshots are read is held in `batch`
/// instead (`stamped_batch.rs`), answered when the batch is flushed: before
/// anything else is answered here, and by the connection loop before it
/// writes its replies out.
pub async fn handle(
    state: &ShardState,
    session: &mut Session,
    batch: &mut Batch,
    id: u64,
    body: &[u8],
    out: &mut BytesMut,
) -> Handled {
    let request = match decode_request(body) {
        Ok(r) => r,
        Err(e) => {
            let need = flush_held(state, batch, out).await;
            let why = format!("cannot decode request: {e}");
            encode_error(out, id, Status::BadRequest, why);
            return Handled { need, close: false };
        }
    };
    // Asked once: a `Hello` changes the session.
    let admission = state.gate.admit(session, &request);
    if matches!(admission, Admission::Proceed) && batch.hold(state, id, &request, out).await {
        // Its reply, and the mark it waits for, come with the flush.
        return Handled {
            need: 0,
            close: false,
        };
    }
    let flushed = flush_held(state, batch, out).await;
    let quiet = Handled {
        need: flushed,
        close: false,
    };
    match admission {
        Admission::Proceed => {}
        Admission::Welcome { member } => {
            reply(out, id, &Response::Welcome { member });
            return quiet;
        }
        Admission::Refuse {
            status,
            message,
            close,
        } => {
            state.metrics.record(request.name(), status, None);
            encode_error(out, id, status, message);
            return Handled {
                need: flushed,
                close,
            };
        }
    }
    // `TxnInquire` exposes too: its `Prepared` answer must speak of a vote
    // record the backups already hold. A recovery's replies are the other
    // way round: `RecoverTablet` answers as soon as the replay is installed
    // (it exposes nothing: the tablet serves nothing yet), and the reads-only
    // `ActivateTablet` that follows waits for the whole log, replay
    // included: its reply tells the coordinator the replay is held here.
    let exposes = !matches!(
        request,
        Request::Ping
            | Request::TakeTablet { .. }
            | Request::DropTablet { .. }
            | Request::ActivateTablet { writes: true, .. }
            | Request::RecoverTablet { .. }
            | Request::MarkLost { .. }
            | Request::ServerDown { .. }
    );
    let kind = request.name();
    let _running = matches!(request, Request::Scan { .. } | Request::Query { .. })
        .then(|| state.metrics.scan_started());
    // Point requests are all timed (not only the sampled ones): the longest
    // is what a benchmark asks for, and a rare slow call is what it wants to
    // see. They never yield, so this is the time they held the shard. Two
    // clock reads (~50 ns) against the ~8 µs a request costs here.
    // The latency histogram still takes one request in 16 (appending is
    // the expensive part); the longest point call sees them all.
    // A plain write that takes a timestamp (`stamped.rs`) waits for the
    // oracle with the shard free: not a point call's hold of it.
    let point = request.is_point() && !(request.is_plain_write() && crate::stamped::needed(state));
    let sampled = state.metrics.sample_next();
    let started = (point || sampled).then(std::time::Instant::now);
    let reply_at = out.len();
    // Set by the point reads whose every object read is durable by a mark
    // of its own (see `Handled::need`).
    let mut held_at = None;
    dispatch(state, id, request, out, &mut held_at).await;
    let elapsed = started.map(|t| t.elapsed());
    if point && let Some(elapsed) = elapsed {
        state.metrics.point_call(elapsed);
    }
    let elapsed = elapsed.filter(|_| sampled);
    let status = match check_header(&out[reply_at..], usize::MAX) {
        Ok(Some((header, _))) => header.status,
        _ => Status::Internal,
    };
    state.metrics.record(kind, status, elapsed);
    let need = match (exposes, held_at) {
        (false, _) => 0,
        (true, Some(mark)) => mark,
        (true, None) => state.engine.borrow().log_changes(),
    };
    Handled {
        need: need.max(flushed),
        close: false,
    }
}

/// Answer the writes `batch` holds into `out` (replies keep the frames'
/// order, so they go before any other). Returns the log mark their replies
/// wait for (0: none held).
pub(crate) async fn flush_held(state: &ShardState, batch: &mut Batch, out: &mut BytesMut) -> u64 {
    if batch.is_empty() {
        return 0;
    }
    batch.flush(state, out).await;
    state.engine.borrow().log_changes()
}

/// Serve one admitted request into `out`. `held_at`: see `handle`.
async fn dispatch(
    state: &ShardState,
    id: u64,
    request: Request<'_>,
    out: &mut BytesMut,
    held_at: &mut Option<u64>,
) {
    match request {
        Request::Ping => reply(out, id, &Response::Pong),
        // `handle` answers every `Hello` at the gate; this arm only keeps the
        // match exhaustive.
        Request::Hello { .. } => reply(out, id, &Response::Welcome { member: false }),
        Request::Read { table, key } => crate::point::read(state, id, (table, key), out, held_at),
        Request::Write {
            table,
            key,
            value,
            rules: r,
            expires_at_ms,
        } => crate::point::write(state, id, (table, key), (value, expires_at_ms), r, out).await,
        Request::Remove {
            table,
            key,
            rules: r,
        } => crate::point::remove(state, id, (table, key), r, out).await,
        Request::Increment {
            table,
            key,
            delta,
            rules: r,
        } => crate::point::increment(state, id, (table, key), delta, r, out).await,
        Request::MultiRead { table, keys } => {
            *held_at = crate::multi::read(state, id, table, &keys, out);
        }
        Request::SnapshotRead {
            table,
            snapshot_ts,
            keys,
        } => crate::snapshot_read::read(state, id, (table, snapshot_ts), &keys, out).await,
        Request::MultiWrite { table, items } => {
            crate::multi::write(state, id, table, &items, out).await
        }
        Request::MultiRemove { table, keys } => {
            crate::multi::remove(state, id, table, &keys, out).await
        }
        Request::Enumerate {
            table,
            tablet_start,
            from_hash,
            max_bytes,
        } => crate::enumerate::handle(state, id, (table, tablet_start), from_hash, max_bytes, out),
        Request::ShardStats { reset_longest_call } => {
            let stats = crate::metrics::shard_stats(state, reset_longest_call);
            reply(out, id, &Response::ShardStats(stats))
        }
        Request::TakeTablet {
            table,
            start_hash,
            end_hash,
            map_version,
            state: tablet_state,
            migration,
        } => crate::tablet_control::take(
            state,
            id,
            (table, start_hash, end_hash),
            (map_version, tablet_state, migration),
            out,
        ),
        Request::DropTablet {
            table,
            start_hash,
            only_if_not_serving,
        } => crate::tablet_control::drop_tablet(
            state,
            id,
            (table, start_hash),
            only_if_not_serving,
            out,
        ),
        Request::ActivateTablet {
            table,
            start_hash,
            map_version,
            writes,
        } => {
            let tablet = (table, start_hash);
            crate::tablet_control::activate(state, id, tablet, map_version, writes, out)
        }
        Request::MigrateTablet {
            table,
            start_hash,
            dest_addr,
            migration,
        } => {
            let result =
                crate::migrate::migrate_out(state, table, start_hash, &dest_addr, migration).await;
            reply_or_refuse(out, id, result.map(|()| Response::Done))
        }
        Request::MigrateBatch {
            table,
            start_hash,
            migration,
            next_version,
            commit_ts_bound,
            objects,
            records,
        } => {
            let result = crate::migrate::install_batch(
                state,
                (table, start_hash, migration),
                (next_version, commit_ts_bound),
                &objects,
                &records,
            );
            reply_or_refuse(out, id, result.map(|()| Response::Done))
        }
        Request::Scan {
            table,
            start_hash,
            end_hash,
            map_version,
            plan,
            op_id,
            budget_ms,
            snapshot_ts,
        } => {
            let tablet = (table, start_hash, end_hash, map_version);
            let run = (op_id, budget_ms, snapshot_ts);
            crate::scan::handle(state, id, tablet, plan, run, out).await
        }
        Request::Query {
            table,
            start_hash,
            end_hash,
            map_version,
            schema,
            plan,
            resume,
            index,
            snapshot_ts,
        } => {
            let tablet = (table, start_hash, end_hash, map_version);
            let run = (resume, index, snapshot_ts);
            crate::query::handle(state, id, tablet, (schema, plan), run, out).await
        }
        Request::TxnPrepare {
            txn,
            primary,
            others,
            items,
            writes,
        } => crate::txn::prepare(state, id, txn, primary, others, &items, writes, out).await,
        Request::TxnDecide {
            txn,
            commit,
            commit_ts,
            direct,
        } => crate::txn::decide(state, id, txn, (commit, commit_ts), direct, out).await,
        Request::TxnResolve { txn, anchor } => {
            crate::txn_resolve::resolve(state, id, txn, anchor, out).await
        }
        Request::TxnInquire { txn, anchor, part } => {
            crate::txn_resolve::inquire(state, id, txn, anchor, part, out).await
        }
        Request::RecoverTablet {
            table,
            start_hash,
            end_hash,
            map_version,
            master,
            backups,
            accept_missing,
        } => {
            let req = crate::recover::RecoverTablet {
                table,
                start_hash,
                end_hash,
                map_version,
                master,
                backups,
                accept_missing,
            };
            let result = crate::recover::recover_tablet(state, req).await;
            let result = result.map(|r| Response::Recovered {
                objects: r.objects,
                segments: r.segments,
                bytes: r.bytes,
            });
            reply_or_refuse(out, id, result)
        }
        Request::MarkLost {
            table,
            start_hash,
            lost_from,
            version_floor,
        } => {
            let result = crate::lost::mark(state, table, start_hash, lost_from, version_floor);
            reply_or_refuse(out, id, result.map(|()| Response::Done))
        }
        Request::ServerDown { server_id } => {
            tracing::info!(
                shard = state.index,
                server_id,
                "server declared dead; re-replicating what it held"
            );
            state.repl.server_down(server_id);
            reply(out, id, &Response::Done)
        }
        // The other listeners' requests (`Request::destination`, the one
        // list of them), refused naming where they belong.
        elsewhere => match elsewhere.destination() {
            Destination::Backup => encode_error(out, id, Status::BadRequest, FOR_BACKUP),
            Destination::Coordinator => encode_error(out, id, Status::BadRequest, FOR_COORDINATOR),
            Destination::Shard => {
                debug_assert!(false, "{} has no arm here", elsewhere.name());
                let why = format!("{} has no handler on a shard", elsewhere.name());
                encode_error(out, id, Status::Internal, why)
            }
        },
    }
}
