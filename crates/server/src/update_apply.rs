//! An update's phase two, shared by updates and removals of raw objects
//! (`Op::Update`, `Op::Remove`) and of typed rows (`Op::UpdateRows`,
//! `Op::RemoveRows`): check every collected key, then write.
//!
//! Two passes over the keys, each in slices of about `CHUNK` with a yield
//! between them. The run's hold keeps other writes, other updates and tablet
//! moves out meanwhile, so the objects cannot change between the passes and
//! the tablet never shows half an update to anyone but reads. The first pass
//! computes every new value and refuses the whole update (naming the key) if
//! one object cannot take it (too short or not a row of the schema, or an
//! `add` that overflows the field); only then does the second write. A
//! refused update therefore writes nothing on this tablet. While snapshots
//! are read here, the second pass writes under one timestamp taken between
//! the passes (`stamped::bulk_timestamp`), keeping each replaced value for
//! snapshots before it; snapshot reads wait for the hold to go.

use std::time::Instant;

use insitu_compute::kernel::Kernel;
use insitu_compute::{apply_update, eval};
use insitu_protocol::Status;
use insitu_protocol::plan::{Field, ScanPlan, UpdateAction};
use insitu_query::{Compiled, RowUpdate};
use insitu_rows::RowRef;

use crate::handler::engine_status;
use crate::scan_run::{CHUNK, ObjectSink, Refusal, Run, show_key};
use crate::update_keys::ChargedKeys;

/// Updated objects between two clock checks in an update's apply phase.
const UPDATES_PER_STEP: usize = 64;

/// What an update does to one object.
pub(crate) enum Change<'a> {
    /// A number at a byte offset of a raw value.
    Field {
        /// For its raw filter (re-checked: the object may have changed since
        /// the keys were collected) and the "too short" message.
        plan: &'a ScanPlan,
        field: Field,
        action: UpdateAction,
        /// Bytes a value needs for everything the plan reads.
        need: usize,
    },
    /// Columns of a typed row (its filter is in the `RowUpdate`).
    Row(&'a RowUpdate),
    /// Remove the object if the plan's raw filter still passes it.
    Remove {
        plan: &'a ScanPlan,
        /// Bytes a value needs for the filter.
        need: usize,
    },
    /// Remove the row if the typed filter still passes it.
    RemoveRow(&'a Compiled),
}

/// What phase two does to one object.
pub(crate) enum Write {
    /// Store these bytes (keeping the object's deadline).
    Put(Vec<u8>),
    Remove,
}

impl Change<'_> {
    /// What to write for the object; `None` when it no longer matches; a
    /// refusal naming the key when it cannot take the change.
    fn write_for(&self, key: &[u8], value: &[u8]) -> Result<Option<Write>, Refusal> {
        let refused = |e: String| {
            (
                Status::BadRequest,
                format!(
                    "update refused at key {}: {e}; nothing was written on this tablet",
                    show_key(key)
                ),
            )
        };
        match self {
            Change::Field {
                plan,
                field,
                action,
                need,
            } => {
                if !raw_matches(plan, *need, key, value)? {
                    return Ok(None);
                }
                let mut new = value.to_vec();
                apply_update(*field, *action, &mut new).map_err(refused)?;
                Ok(Some(Write::Put(new)))
            }
            Change::Row(update) => Ok(update.apply(value).map_err(refused)?.map(Write::Put)),
            Change::Remove { plan, need } => {
                Ok(raw_matches(plan, *need, key, value)?.then_some(Write::Remove))
            }
            Change::RemoveRow(compiled) => {
                let row =
                    RowRef::new(compiled.layout(), value).map_err(|e| refused(e.to_string()))?;
                Ok(compiled.filter(&row).then_some(Write::Remove))
            }
        }
    }
}

/// Whether the raw plan's filter passes `value` (re-checked in phase two:
/// the object may have changed since its key was collected); a value too
/// short for the plan refuses the update.
fn raw_matches(plan: &ScanPlan, need: usize, key: &[u8], value: &[u8]) -> Result<bool, Refusal> {
    if value.len() < need {
        return Err(crate::scan::short_error(plan, need, key, value.len()));
    }
    Ok(matches!(eval(&plan.filter, value), Ok(true)))
}

/// Phase one of a typed update or removal: the keys of the rows its filter
/// passes.
pub(crate) struct RowKeys<'a, 'e> {
    /// The filter, and the row layout to read rows with.
    pub compiled: &'a Compiled,
    pub keys: ChargedKeys<'e>,
    /// Rows seen and rows matched (the reply's `visited` / `matched`).
    pub visited: u64,
    pub matched: u64,
    /// The first row that did not decode with the schema: (key, why).
    pub bad: Option<(Vec<u8>, String)>,
}

impl<'a, 'e> RowKeys<'a, 'e> {
    pub fn new(compiled: &'a Compiled, keys: ChargedKeys<'e>) -> Self {
        RowKeys {
            compiled,
            keys,
            visited: 0,
            matched: 0,
            bad: None,
        }
    }

    /// Why the update must be refused, if a row did not decode.
    pub fn refusal(&self) -> Option<Refusal> {
        self.bad.as_ref().map(|(key, why)| {
            (
                Status::BadRequest,
                format!(
                    "row of key {}: {why}; nothing was written on this tablet",
                    show_key(key)
                ),
            )
        })
    }
}

impl ObjectSink for RowKeys<'_, '_> {
    fn object(&mut self, key: &[u8], value: &[u8]) {
        if self.bad.is_some() {
            return;
        }
        self.visited += 1;
        match self.compiled.keep(value) {
            Err(e) => self.bad = Some((key.to_vec(), e.to_string())),
            Ok(Some(_)) => {
                self.matched += 1;
                self.keys.visit(key, value);
            }
            Ok(None) => {}
        }
    }

    fn reset(&mut self) {
        self.keys.reset();
        self.visited = 0;
        self.matched = 0;
        self.bad = None;
    }

    fn done(&self) -> bool {
        self.bad.is_some() || self.keys.refused
    }
}

/// Gives the shard back after about `CHUNK` of an update's per-key work
/// (the clock is read every `UPDATES_PER_STEP` keys) and re-checks the
/// tablet after each yield.
struct Slices(Instant);

impl Slices {
    fn new() -> Slices {
        Slices(Instant::now())
    }

    async fn at(&mut self, run: &Run<'_>, i: usize) -> Result<(), Refusal> {
        if i.is_multiple_of(UPDATES_PER_STEP) && i > 0 && self.0.elapsed() >= CHUNK {
            tokio::task::yield_now().await;
            run.check()?;
            self.0 = Instant::now();
        }
        Ok(())
    }
}

/// First pass: check that every collected key can take the change, writing
/// nothing.
pub(crate) async fn check_updates(
    run: &Run<'_>,
    keys: &ChargedKeys<'_>,
    change: &Change<'_>,
) -> Result<(), Refusal> {
    assert!(run.hold.is_some(), "an update runs holding its tablet");
    run.check()?;
    let mut slices = Slices::new();
    for (i, key) in keys.iter().enumerate() {
        slices.at(run, i).await?;
        let engine = run.state.engine.borrow();
        let Ok(o) = engine.read(run.table, key) else {
            continue; // removed meanwhile: nothing to update
        };
        change.write_for(key, o.value)?;
    }
    Ok(())
}

/// Second pass: write every collected key that still matches
/// (`check_updates` ran over the same, unchanged objects), keeping each
/// replaced value under `commit_ts` for snapshots before it
/// (`stamped::bulk_timestamp`; 0: none).
pub(crate) async fn write_updates(
    run: &Run<'_>,
    keys: &ChargedKeys<'_>,
    change: &Change<'_>,
    commit_ts: u64,
) -> Result<u64, Refusal> {
    assert!(run.hold.is_some(), "an update runs holding its tablet");
    let mut updated = 0u64;
    let rules = insitu_engine::RejectRules::default();
    let mut slices = Slices::new();
    for (i, key) in keys.iter().enumerate() {
        slices.at(run, i).await?;
        let mut engine = run.state.engine.borrow_mut();
        // An update keeps the object's deadline, as an increment does.
        let (write, expires_at_ms) = {
            let Ok(o) = engine.read(run.table, key) else {
                continue;
            };
            match change.write_for(key, o.value) {
                Ok(Some(w)) => {
                    // The value replaced, for snapshots before the update.
                    let mut versions = run.state.versions.borrow_mut();
                    let before = Some(crate::versions::Before::from(o));
                    let at = (run.table, key);
                    crate::stamped::keep_before(&mut versions, &engine, at, commit_ts, before);
                    (w, o.expires_at_ms)
                }
                Ok(None) => continue,
                // Checked by the first pass over the same, unchanged objects.
                Err((_, e)) => {
                    return Err((Status::Internal, format!("update changed under us: {e}")));
                }
            }
        };
        let done = match write {
            Write::Put(value) => {
                engine.write_expiring(run.table, key, &value, expires_at_ms, &rules)
            }
            Write::Remove => engine.remove(run.table, key, &rules),
        };
        if let Err(e) = done {
            return Err((
                engine_status(&e),
                format!(
                    "update stopped after {updated} of {} objects: {e}",
                    keys.len()
                ),
            ));
        }
        updated += 1;
    }
    Ok(updated)
}
