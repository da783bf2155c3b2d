//! Data operations (pushdown): run a `ScanPlan` over one tablet of this shard.
//!
//! Exact or error:
//! - the request names the tablet's hash range and map version; they are
//!   checked against the shard's tablet state before the scan, between chunks
//!   and after it (`StaleMap` / `UnknownTablet` / `Retry`), so a reply is only
//!   ever computed over exactly the tablet the client meant;
//! - a long scan runs in chunks of about `CHUNK` of work and yields to the
//!   shard's event loop in between, so requests on other connections of this
//!   shard wait at most about one chunk. Between chunks the tablet may be
//!   written or cleaned, which would make the log cursor inexact; the engine's
//!   `ScanToken` detects that and the scan restarts, this time holding the
//!   tablet (`hold.rs`: writes to it get `Retry`, the cleaner skips it), so
//!   the second attempt still yields every chunk and cannot be disturbed.
//!   Nothing runs without yielding; a scan that still restarts more than
//!   `MAX_RESTARTS` times (a hold lost to a drop and re-create) answers `Retry`.
//! - an update holds its tablet from start to end: it first collects the
//!   matched keys (a read-only chunked scan, so it never sees its own new
//!   versions), then applies the changes in slices of about `CHUNK`, yielding
//!   in between. Other writes to the tablet get `Retry` meanwhile, and a tablet
//!   move waits for the update to finish, so it never observes half of it.

use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use insitu_compute::kernel::{Kernel, Visit};
use insitu_compute::reference::{RunKernel, read_op};
use insitu_compute::validate::describe_need;
use insitu_compute::validate_plan;
use insitu_protocol::plan::{Op, Partial, ScanPlan, ScanResult};
use insitu_protocol::{Response, Status};
use insitu_query::{Compiled, RowUpdate, compile_filter};

use crate::hold::{Hold, HoldKind};
use crate::scan_run::{Refusal, Run, show_key};
use crate::shard::ShardState;
use crate::snapshot::{self, Overlay, Snap};
use crate::update_apply::{Change, RowKeys, check_updates, write_updates};
use crate::update_keys::ChargedKeys;
use crate::update_log::{self, UpdateKey, UpdateState};

pub(crate) fn short_error(plan: &ScanPlan, need: usize, key: &[u8], len: usize) -> Refusal {
    (
        Status::BadRequest,
        format!(
            "value of key {} is {len} bytes, too short for {} (needs {need} bytes)",
            show_key(key),
            describe_need(plan)
        ),
    )
}

async fn run_kernel<K: Kernel>(
    run: &mut Run<'_>,
    plan: &ScanPlan,
    kernel: K,
    need: usize,
    snap: Option<&Snap>,
) -> Result<(K, u64, u64), Refusal> {
    let filtered = plan.key_range.is_some() || !plan.filter.is_empty();
    macro_rules! go {
        ($f:literal) => {{
            let mut v: Visit<'_, K, $f> = Visit::new(kernel, need, plan);
            match snap {
                None => run.scan(&mut v).await?,
                Some(snap) => {
                    let tablet = (run.table, (run.start_hash, run.end_hash));
                    let mut o = Overlay::new(v, run.state, tablet, snap, &plan.source);
                    run.scan(&mut o).await?;
                    v = o.finish().await;
                }
            }
            if let Some((key, len)) = &v.short {
                return Err(short_error(plan, need, key, *len));
            }
            Ok((v.kernel, v.visited, v.matched))
        }};
    }
    if filtered { go!(true) } else { go!(false) }
}

/// A read-only operation's kernel over the tablet in chunks (`run_kernel`),
/// as `read_op` picks it.
struct Chunked<'r, 'e> {
    run: &'r mut Run<'e>,
    plan: &'r ScanPlan,
    /// Bytes a value needs (`validate_plan`).
    need: usize,
    snap: Option<&'r Snap>,
}

/// A read-only operation's result and the objects visited and matched.
type Counted<'r> = Pin<Box<dyn Future<Output = Result<(Partial, u64, u64), Refusal>> + 'r>>;

impl<'r> RunKernel for Chunked<'r, '_> {
    type Out = Counted<'r>;
    fn run<K: Kernel + 'static>(self, kernel: K, finish: fn(K) -> Partial) -> Counted<'r> {
        Box::pin(async move {
            let (k, visited, matched) =
                run_kernel(self.run, self.plan, kernel, self.need, self.snap).await?;
            Ok((finish(k), visited, matched))
        })
    }
}

/// Run `plan` over one tablet. An update named by `op` records its progress
/// (`update_log.rs`), so a resend is never applied twice.
async fn execute(
    state: &ShardState,
    (table, start_hash, end_hash): (u64, u64, u64),
    map_version: u64,
    plan: &ScanPlan,
    (deadline, op): (Option<Instant>, Option<UpdateKey>),
    snapshot_ts: u64,
) -> Result<ScanResult, Refusal> {
    let started = Instant::now();
    let need = validate_plan(plan).map_err(|e| (Status::BadRequest, format!("bad plan: {e}")))?;
    if snapshot_ts != 0 && plan.op.is_update() {
        return Err((
            Status::BadRequest,
            "an update cannot run at a snapshot (it changes the newest versions)".into(),
        ));
    }
    let mut run = Run {
        state,
        table,
        start_hash,
        end_hash,
        map_version,
        source: &plan.source,
        write: plan.op.is_update(),
        restarts: 0,
        index_snap: std::cell::RefCell::new(None),
        hold: None,
        // At a snapshot, expiry is judged at its instant (`scan_run.rs`).
        clock_ms: (snapshot_ts != 0).then(|| crate::versions::clock_ms_at(snapshot_ts)),
    };
    // The anchor of this update's started record, once written.
    let mut begun: Option<Vec<u8>> = None;
    if plan.op.is_update() {
        // Checked first so a moving tablet is refused at once, not waited for.
        run.check()?;
        run.hold = Some(Hold::take(state, table, start_hash, HoldKind::Update).await?);
    }
    let snap = match snapshot_ts {
        0 => None,
        ts => {
            // Checked first so a moving tablet is refused at once, not waited for.
            run.check()?;
            Some(snapshot::begin(state, table, (start_hash, end_hash), ts).await?)
        }
    };
    let snap = snap.as_ref();
    let (partial, visited, matched) = match &plan.op {
        Op::Update { field, action } => {
            let (keys, vis, m) =
                run_kernel(&mut run, plan, ChargedKeys::new(&state.engine), need, None).await?;
            let change = Change::Field {
                plan,
                field: *field,
                action: *action,
                need,
            };
            let updated = apply(&mut run, keys, &change, deadline, op, &mut begun).await?;
            (Partial::Update { updated }, vis, m)
        }
        Op::UpdateRows {
            schema,
            filter,
            set,
        } => {
            let update = RowUpdate::compile(schema, filter, set)
                .map_err(|e| (Status::BadRequest, e.to_string()))?;
            let (keys, vis, m) = row_keys(&mut run, update.compiled()).await?;
            let change = Change::Row(&update);
            let updated = apply(&mut run, keys, &change, deadline, op, &mut begun).await?;
            (Partial::Update { updated }, vis, m)
        }
        Op::Remove => {
            let (keys, vis, m) =
                run_kernel(&mut run, plan, ChargedKeys::new(&state.engine), need, None).await?;
            let change = Change::Remove { plan, need };
            let updated = apply(&mut run, keys, &change, deadline, op, &mut begun).await?;
            (Partial::Update { updated }, vis, m)
        }
        Op::RemoveRows { schema, filter } => {
            let compiled =
                compile_filter(schema, filter).map_err(|e| (Status::BadRequest, e.to_string()))?;
            let (keys, vis, m) = row_keys(&mut run, &compiled).await?;
            let change = Change::RemoveRow(&compiled);
            let updated = apply(&mut run, keys, &change, deadline, op, &mut begun).await?;
            (Partial::Update { updated }, vis, m)
        }
        // Every other operation only reads (`read_op` says None to writes).
        read => {
            let chunked = Chunked {
                run: &mut run,
                plan,
                need,
                snap,
            };
            let not_read = || (Status::Internal, "a write taken for a read".to_string());
            read_op(read, chunked).ok_or_else(not_read)?.await?
        }
    };
    if let Some(snap) = snap {
        snapshot::check_end(state, snap)?;
    }
    let result = ScanResult {
        visited,
        matched,
        server_nanos: started.elapsed().as_nanos() as u64,
        restarts: run.restarts,
        partial,
    };
    if let (Some(k), Some(anchor)) = (op, begun) {
        update_log::finish(state, k, &anchor, &result);
    }
    Ok(result)
}

/// Phase one of a typed update or removal: the keys of the rows `compiled`
/// passes, and the rows visited and matched.
async fn row_keys<'e>(
    run: &mut Run<'e>,
    compiled: &Compiled,
) -> Result<(ChargedKeys<'e>, u64, u64), Refusal> {
    let mut rows = RowKeys::new(compiled, ChargedKeys::new(&run.state.engine));
    run.scan(&mut rows).await?;
    if let Some(refusal) = rows.refusal() {
        return Err(refusal);
    }
    Ok((rows.keys, rows.visited, rows.matched))
}

/// An update's phase two over the keys phase one collected: refused as a
/// whole if the list did not fit the budget, the client's deadline passed,
/// or one object cannot take the change; else every change written.
/// `begun` is set to the anchor of the update's started record once written.
async fn apply(
    run: &mut Run<'_>,
    mut keys: ChargedKeys<'_>,
    change: &Change<'_>,
    deadline: Option<Instant>,
    op: Option<UpdateKey>,
    begun: &mut Option<Vec<u8>>,
) -> Result<u64, Refusal> {
    keys.settle();
    if keys.refused {
        return Err((
            Status::OutOfMemory,
            format!(
                "the update's list of matched keys does not fit in this server's memory budget \
                 ({} bytes were charged when it was refused); nothing was written on this tablet",
                keys.charged_bytes()
            ),
        ));
    }
    // The client stops waiting at its deadline: then write nothing.
    // Past this check the apply phase runs to its end (yielding, with
    // the tablet held), so a tablet's update is applied fully or not at all.
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Err((
            Status::Retry,
            format!(
                "the update's time budget passed after collecting {} keys; nothing was written on this tablet",
                keys.len()
            ),
        ));
    }
    // The writes below may need the cleaner to make room in this tablet.
    if let Some(hold) = run.hold.as_mut() {
        hold.release_cleaner();
    }
    check_updates(run, &keys, change).await?;
    // Nothing to write: no timestamp, and the table's commit bound stays.
    if keys.len() == 0 {
        return Ok(0);
    }
    // Still holding the tablet: no write lands between the timestamp and
    // the update's last write (`stamped::bulk_timestamp`).
    let commit_ts = crate::stamped::bulk_timestamp(run.state, run.table).await;
    run.check()?;
    // From the first write on, a crash leaves a trace a resend finds.
    if let (Some(k), Some(anchor)) = (op, keys.iter().next()) {
        update_log::begin(run.state, k, anchor)?;
        *begun = Some(anchor.to_vec());
    }
    write_updates(run, &keys, change, commit_ts).await
}

/// Serve `Request::Scan` over the tablet it names: (table, start hash, end
/// hash, map version).
pub async fn handle(
    state: &ShardState,
    id: u64,
    (table, start_hash, end_hash, map_version): (u64, u64, u64, u64),
    plan: ScanPlan,
    (op_id, budget_ms, snapshot_ts): (u64, u32, u64),
    out: &mut BytesMut,
) {
    let deadline =
        (budget_ms > 0).then(|| Instant::now() + Duration::from_millis(budget_ms as u64));
    let remembered = (op_id != 0 && plan.op.is_update()).then_some((table, start_hash, op_id));
    let result = match remembered.and_then(|k| update_log::lookup(state, k)) {
        Some(UpdateState::Done(r)) => Ok(r),
        Some(UpdateState::Running) => Err((
            Status::Retry,
            format!("update {op_id:#x} is still running on this tablet"),
        )),
        Some(UpdateState::Interrupted) => Err(update_log::interrupted(op_id)),
        None => {
            if let Some(k) = remembered {
                update_log::remember(k, Some(UpdateState::Running));
            }
            let r = execute(
                state,
                (table, start_hash, end_hash),
                map_version,
                &plan,
                (deadline, remembered),
                snapshot_ts,
            )
            .await;
            if let Some(k) = remembered {
                // An applied update is remembered; a refusal before its first
                // write is forgotten (a resend may run it afresh); one cut
                // off part-way left its started record (see update_log.rs).
                let after = match &r {
                    Ok(result) => Some(UpdateState::Done(result.clone())),
                    Err(_) => update_log::lookup_durable(state, k),
                };
                update_log::remember(k, after);
            }
            r
        }
    };
    crate::handler::reply_or_refuse(out, id, result.map(Response::Scan));
}
