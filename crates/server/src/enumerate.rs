//! Enumeration (`Request::Enumerate`: `insitu scan`, `Client::scan`) in
//! O(batch) per request.
//!
//! The protocol stays stateless: the cursor is a key hash, and objects come
//! back in hash order. A batch walks the tablet's sorted list of hash groups
//! (`Engine::sorted_hashes`, two O(n) passes to take, 4 bytes per object
//! charged to the memory budget; a group is the keys of one 28-bit index
//! prefix, almost always one key) and looks every group up in the index
//! (`Engine::objects_in_hash_group`), so a batch costs O(batch). The shard keeps
//! the lists of up to `MAX_CACHED_WALKS` enumerations in progress, keyed by
//! (table, tablet start, the cursor the client will send next) and valid
//! only for the same tablet instance and range; a request that matches one
//! continues from it, any other request takes a new list from its cursor.
//! Correctness never depends on the cache: a miss costs one new list (two O(n) passes).
//!
//! Guarantee: an object present and unchanged for the whole enumeration is
//! returned exactly once (hashes only grow from batch to batch, the objects
//! of one group always travel in one batch, and a list taken from cursor `c`
//! holds every group with a hash >= `c` present at that moment). An object written during
//! the enumeration may be returned with either value or, if created after
//! its list was taken, not at all; a removed one is not returned.

use bytes::BytesMut;
use insitu_engine::{Engine, EngineError, ObjectRef, SortedHashes};
use insitu_protocol::frame::MAX_BODY_BYTES;
use insitu_protocol::{Object, Response, blob, encode_error};

use crate::handler::{REPLY_SLACK_BYTES, reply, reply_engine_error};
use crate::shard::ShardState;

/// Enumerations in progress whose hash lists a shard keeps (least recently
/// used evicted). Each list is charged to the budget; 8 bounds the worst
/// case to 8 x 4 bytes per object of the largest tablets.
pub const MAX_CACHED_WALKS: usize = 8;

/// Reply bytes counted per object beyond its key and value (version and
/// length prefixes), as the wire reply's size estimate.
const OBJECT_OVERHEAD_BYTES: usize = 24;
/// Work one batch may do before it ends early (the client just asks again
/// from the returned cursor): a 1 MiB batch of small objects is ~20k index
/// probes plus their encoding, ~25 ms, which held every other connection of
/// the shard that long. Checked every `HASHES_PER_CLOCK_CHECK` hashes.
const BATCH_WORK: std::time::Duration = std::time::Duration::from_millis(1);
const HASHES_PER_CLOCK_CHECK: usize = 256;

/// One enumeration in progress.
struct Walk {
    list: SortedHashes,
    /// Position in `list` of `next_hash`.
    pos: usize,
    /// The cursor the client's next request will carry.
    next_hash: u64,
    /// Cache clock when last used, for eviction.
    last_used: u64,
}

/// A shard's enumerations in progress.
#[derive(Default)]
pub struct EnumerateCache {
    walks: Vec<Walk>,
    /// Counts requests; orders walks by recency.
    clock: u64,
}

impl EnumerateCache {
    /// Walks kept now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.walks.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.walks.is_empty()
    }

    /// The objects of the tablet starting at `tablet_start` with hash >=
    /// `from_hash`, in hash order (key order within a hash), up to about
    /// `max_bytes` (at least one hash's objects; never splitting a hash),
    /// and the cursor to continue from (`None`: the tablet is done).
    pub fn next_batch<'e>(
        &mut self,
        engine: &'e Engine,
        table: u64,
        tablet_start: u64,
        from_hash: u64,
        max_bytes: usize,
    ) -> Result<(Vec<ObjectRef<'e>>, Option<u64>), EngineError> {
        self.clock += 1;
        // Lists of dropped, re-created or split tablets go (and their charge).
        self.walks.retain(|w| engine.sorted_hashes_current(&w.list));
        let hit = self.walks.iter().position(|w| {
            w.list.table() == table
                && w.list.start_hash() == tablet_start
                && w.next_hash == from_hash
        });
        let mut walk = match hit {
            Some(i) => self.walks.swap_remove(i),
            None => Walk {
                list: engine.sorted_hashes(table, tablet_start, from_hash)?,
                pos: 0,
                next_hash: from_hash,
                last_used: 0,
            },
        };
        let mut objects = Vec::new();
        let mut group = Vec::new();
        let mut used = 0usize;
        let mut next = None;
        let started = std::time::Instant::now();
        let mut visited = 0usize;
        let mut slot = walk.list.next_from(walk.pos);
        while let Some((pos, h)) = slot {
            visited += 1;
            if visited.is_multiple_of(HASHES_PER_CLOCK_CHECK)
                && !objects.is_empty()
                && started.elapsed() >= BATCH_WORK
            {
                next = Some(h);
                walk.pos = pos;
                break;
            }
            group.clear();
            engine.objects_in_hash_group(table, tablet_start, h, |o| group.push(o))?;
            let size: usize = group
                .iter()
                .map(|o| o.key.len() + o.value.len() + OBJECT_OVERHEAD_BYTES)
                .sum();
            if !objects.is_empty() && used + size > max_bytes {
                next = Some(h);
                walk.pos = pos;
                break;
            }
            used += size;
            objects.append(&mut group);
            slot = walk.list.next_from(pos + 1);
        }
        if let Some(h) = next {
            walk.next_hash = h;
            walk.last_used = self.clock;
            if self.walks.len() >= MAX_CACHED_WALKS
                && let Some(oldest) = (0..self.walks.len()).min_by_key(|&i| self.walks[i].last_used)
            {
                self.walks.swap_remove(oldest);
            }
            self.walks.push(walk);
        }
        Ok((objects, next))
    }
}

/// Serve `Request::Enumerate`: refused while the tablet is moved or gone,
/// else the next batch from `from_hash` of at most `max_bytes` (clamped to
/// what fits a reply).
pub(crate) fn handle(
    state: &ShardState,
    id: u64,
    (table, tablet_start): (u64, u64),
    from_hash: u64,
    max_bytes: u32,
    out: &mut BytesMut,
) {
    let refusal = state
        .tablets
        .borrow()
        .get(&(table, tablet_start))
        .and_then(|m| m.refusal(false));
    if let Some(status) = refusal {
        return encode_error(out, id, status, "tablet is being moved or has moved");
    }
    let max_bytes = (max_bytes as usize).clamp(1, MAX_BODY_BYTES - REPLY_SLACK_BYTES);
    let engine = state.engine.borrow();
    // O(batch): continues the tablet's sorted hash list (`next_batch`).
    let batch =
        state
            .enumerate
            .borrow_mut()
            .next_batch(&engine, table, tablet_start, from_hash, max_bytes);
    let (found, next_hash) = match batch {
        Ok(b) => b,
        Err(e) => return reply_engine_error(out, id, &e),
    };
    let objects: Vec<Object<'_>> = found
        .iter()
        .map(|o| Object {
            key: blob(o.key),
            value: blob(o.value),
            version: o.version,
            expires_at_ms: o.expires_at_ms,
        })
        .collect();
    reply(out, id, &Response::Enumerate { objects, next_hash })
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_engine::{EngineConfig, HashRange, RejectRules, key_hash};
    use std::collections::HashSet;

    const T: u64 = 2;

    fn engine(objects: u64) -> Engine {
        let config = EngineConfig {
            segment_bytes: 1 << 20,
            memory_budget_bytes: 96 << 20,
            max_value_bytes: 1024,
        };
        let mut e = Engine::new(config).expect("config");
        e.create_tablet(T, HashRange::FULL).expect("tablet");
        for i in 0..objects {
            e.write(
                T,
                &i.to_le_bytes(),
                &i.to_le_bytes(),
                &RejectRules::default(),
            )
            .expect("write");
        }
        e
    }

    /// Enumerate the whole tablet; returns (keys seen, batches, work done).
    fn enumerate_all(
        e: &Engine,
        cache: &mut EnumerateCache,
        max_bytes: usize,
    ) -> (HashSet<Vec<u8>>, u64, u64) {
        let before = e.hash_scan_work();
        let mut seen = HashSet::new();
        let mut cursor = 0;
        let mut batches = 0;
        let mut last = None;
        loop {
            let (objects, next) = cache.next_batch(e, T, 0, cursor, max_bytes).expect("batch");
            batches += 1;
            for o in objects {
                let h = key_hash(T, o.key);
                assert!(h >= cursor && last.is_none_or(|l| l <= h), "hash order");
                last = Some(h);
                assert!(seen.insert(o.key.to_vec()), "returned twice");
            }
            match next {
                Some(n) => cursor = n,
                None => break,
            }
        }
        let after = e.hash_scan_work();
        let work = (after.entries_listed - before.entries_listed)
            + (after.index_probes - before.index_probes);
        (seen, batches, work)
    }

    #[test]
    fn enumeration_work_grows_linearly_with_the_tablet() {
        let mut per_object = Vec::new();
        for n in [100_000u64, 300_000] {
            let e = engine(n);
            let mut cache = EnumerateCache::default();
            let (seen, batches, work) = enumerate_all(&e, &mut cache, 16 * 1024);
            assert_eq!(seen.len() as u64, n);
            assert!(batches > 200, "{batches} batches");
            // One list (two passes over the index) plus one probe per hash,
            // plus one probe per batch for the hash that did not fit.
            assert!(
                work <= 3 * n + batches,
                "{work} units of work for {n} objects"
            );
            eprintln!("enumerate {n} objects: {batches} batches, {work} units of work");
            per_object.push(work as f64 / n as f64);
            assert!(cache.is_empty(), "a finished walk leaves the cache");
            assert_eq!(e.memory().transient_bytes, 0, "its list's charge too");
        }
        // Linear: the same work per object at 3x the size (the old
        // copy-and-sort per batch did ~3x more per object at 3x the size).
        assert!(per_object[1] <= per_object[0] * 1.1, "{per_object:?}");
    }

    #[test]
    fn a_cache_miss_only_costs_a_new_list() {
        let e = engine(5_000);
        let mut seen = HashSet::new();
        let mut cursor = 0;
        loop {
            // A fresh cache every time: every request misses.
            let (objects, next) = EnumerateCache::default()
                .next_batch(&e, T, 0, cursor, 4096)
                .expect("batch");
            for o in objects {
                assert!(seen.insert(o.key.to_vec()), "returned twice");
            }
            match next {
                Some(n) => cursor = n,
                None => break,
            }
        }
        assert_eq!(seen.len(), 5_000);
    }

    #[test]
    fn many_walks_at_once_are_bounded_and_stay_correct() {
        let mut e = engine(3_000);
        let mut cache = EnumerateCache::default();
        let walks = MAX_CACHED_WALKS + 3;
        let mut cursors = vec![Some(0u64); walks];
        let mut seen = vec![HashSet::new(); walks];
        let mut round = 0u64;
        while cursors.iter().any(Option::is_some) {
            for w in 0..walks {
                let Some(c) = cursors[w] else { continue };
                let (objects, next) = cache.next_batch(&e, T, 0, c, 2048).expect("batch");
                for o in objects {
                    assert!(seen[w].insert(o.key.to_vec()), "returned twice");
                }
                cursors[w] = next;
                assert!(cache.len() <= MAX_CACHED_WALKS);
            }
            // Writes in between: overwrites keep every key present.
            round += 1;
            let k = (round * 7919) % 3_000;
            e.write(T, &k.to_le_bytes(), b"new", &RejectRules::default())
                .expect("write");
        }
        assert!(seen.iter().all(|s| s.len() == 3_000));
        // A dropped tablet's lists go with it.
        let (_, next) = cache.next_batch(&e, T, 0, 0, 64).expect("batch");
        assert!(next.is_some() && cache.len() == 1);
        e.drop_tablet(T, 0);
        assert_eq!(
            cache.next_batch(&e, T, 0, 0, 64).err(),
            Some(EngineError::UnknownTablet)
        );
        assert!(cache.is_empty());
        assert_eq!(e.memory().transient_bytes, 0);
    }
}
