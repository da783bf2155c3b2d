//! What a replicator needs to see of the logs: every segment's bytes, named
//! by (log, segment id), and a counter that says whether anything changed.
//!
//! Why a view and not hooks on every append: every byte that reaches a
//! segment (a write, a tombstone, a version mark, a cleaner copy, a replay, a
//! migration's install) shows up here without any write path having to
//! remember to report it, and the engine stays free of I/O and queues. The
//! replicator (in the server) keeps, per segment, how many bytes its backups
//! already hold; a segment it knew that is gone from the view was freed. It
//! walks the view only when `log_changes` moved, so an idle shard pays
//! nothing, and a walk costs one step per segment (2 MiB each: ~500 per GB).
//!
//! Log ids are tablet generations: unique per tablet instance within the
//! process (a dropped and re-created tablet gets a new log), and a restarted
//! server enlists under a new server id, so (server id, log, segment) never
//! names two different segments.

use crate::{Engine, EngineError, TableId};

/// One segment as a replicator sees it.
#[derive(Clone, Copy, Debug)]
pub struct SegmentView<'a> {
    /// The tablet instance's log (its generation).
    pub log: u64,
    pub table: TableId,
    /// Start of the tablet's hash range: with `table` it names the tablet.
    pub start_hash: u64,
    /// The segment id within the log (grows in creation order, never reused).
    pub segment: u64,
    /// The bytes written so far; only ever appended to (the in-memory dead
    /// flag inside an entry may change, which replay ignores).
    pub bytes: &'a [u8],
    /// Neither the tablet's head nor its open survivor: no byte will be
    /// added, so a backup may close the replica.
    pub sealed: bool,
    /// Highest segment id recorded by a tombstone or a side-record removal
    /// in this segment (0: none).
    /// The cleaner drops such a tombstone only once every other segment of
    /// the log with an id up to this is gone, so a replicator must see those
    /// segments' replicas freed before this one's (or a recovery from the
    /// backups in between could bring a removed object back).
    pub max_tombstone_segment: u64,
}

impl Engine {
    /// A number that grows whenever a segment gains bytes, is allocated or is
    /// freed (and so whenever a tablet is created, replayed or dropped with
    /// data). Equal values mean the view is unchanged.
    pub fn log_changes(&self) -> u64 {
        // Both only grow, so their sum grows whenever either does.
        self.budget.clock.wrapping_add(self.budget.changes)
    }

    /// A replication walk at `mark` (`log_changes()` now) saw every segment
    /// as it is: remember, per segment, the length seen and the first mark
    /// at which it was seen (`Segment::walked`). Why the first: a walk whose
    /// mark is published copied every byte present at that walk, and marks
    /// only grow, so once any mark at or after it is durable so are those
    /// bytes; a later walk of an unchanged segment proves nothing new.
    /// O(segments), beside the walk's own pass over them.
    pub fn note_walk(&self, mark: u64) {
        debug_assert_eq!(mark, self.log_changes(), "noted under the walk's borrow");
        for t in self.tablets.iter().flatten() {
            for &slot in &t.order {
                t.segs[slot as usize].note_walk(mark);
            }
        }
    }

    /// Take every entry now in tablet (`table`, `start_hash`) as durable
    /// already: each segment's walk pair becomes (its length, mark 0), so a
    /// read of such an entry waits for no replication round (`read_held`).
    /// For a recovery's replay: its entries are on the dead master's
    /// replicas, which the coordinator keeps (and recovers from again, should
    /// this shard die) until this shard's backups hold the replay. Entries
    /// appended later are held by the walks that see them, as anywhere.
    pub fn note_held_elsewhere(&self, table: TableId, start_hash: u64) -> Result<(), EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        for &slot in &t.order {
            let seg = &t.segs[slot as usize];
            debug_assert!(seg.buf.len() <= u32::MAX as usize);
            let len = seg.buf.len() as u32;
            seg.walked.set([(len, 0), (len, 0)]);
        }
        Ok(())
    }

    /// Visit every segment of every tablet, oldest first within a tablet.
    pub fn for_each_segment(&self, mut f: impl FnMut(SegmentView<'_>)) {
        for t in self.tablets.iter().flatten() {
            for &slot in &t.order {
                let seg = &t.segs[slot as usize];
                debug_assert_ne!(seg.id, 0, "an ordered slot holds a segment");
                f(SegmentView {
                    log: t.generation,
                    table: t.table,
                    start_hash: t.range.start,
                    segment: seg.id,
                    bytes: &seg.buf,
                    sealed: t.head != Some(slot) && t.survivor != Some(slot),
                    max_tombstone_segment: seg.max_tombstone_segment,
                });
            }
        }
    }

    /// The bytes of one segment, if its log and the segment still exist
    /// (for re-replicating a segment whose backup died).
    pub fn segment_bytes(&self, log: u64, segment: u64) -> Option<&[u8]> {
        let t = self
            .tablets
            .iter()
            .flatten()
            .find(|t| t.generation == log)?;
        t.order
            .iter()
            .map(|&s| &t.segs[s as usize])
            .find(|s| s.id == segment)
            .map(|s| &s.buf[..])
    }

    /// The log id of the tablet starting at `start_hash` of `table`.
    pub fn log_of(&self, table: TableId, start_hash: u64) -> Option<u64> {
        self.tablets
            .iter()
            .flatten()
            .find(|t| t.table == table && t.range.start == start_hash)
            .map(|t| t.generation)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::{Engine, EngineConfig, EngineError, HashRange, RejectRules};

    fn engine() -> Engine {
        let config = EngineConfig {
            segment_bytes: 128 * 1024,
            memory_budget_bytes: 8 << 20,
            max_value_bytes: 1024,
        };
        Engine::new(config).expect("engine")
    }

    /// The bytes a replicator would hold: per (log, segment), all bytes seen.
    fn snapshot(e: &Engine) -> BTreeMap<(u64, u64), Vec<u8>> {
        let mut m = BTreeMap::new();
        e.for_each_segment(|v| {
            m.insert((v.log, v.segment), v.bytes.to_vec());
        });
        m
    }

    #[test]
    fn changes_move_with_writes_and_frees_and_replay_restores_the_view() {
        let mut e = engine();
        let range = HashRange::FULL;
        e.create_tablet(1, range).expect("tablet");
        let before = e.log_changes();
        assert_eq!(e.log_changes(), before, "nothing happened");
        let rules = RejectRules::default();
        for i in 0..4000u32 {
            let key = (i % 300).to_le_bytes();
            e.write(1, &key, &[7u8; 200], &rules).expect("write");
        }
        assert!(e.log_changes() > before);
        let mut sealed = 0;
        e.for_each_segment(|v| sealed += v.sealed as u32);
        assert!(
            sealed > 0,
            "4000 writes of ~240 bytes fill several 128 KiB segments"
        );
        let log = e.log_of(1, range.start).expect("log");
        let view = snapshot(&e);
        for ((l, s), bytes) in &view {
            assert_eq!(*l, log);
            assert_eq!(e.segment_bytes(*l, *s), Some(&bytes[..]));
        }
        // Cleaning frees segments: the view shrinks, the counter moves.
        let at = e.log_changes();
        e.clean();
        assert!(e.log_changes() > at);
        let cleaned = snapshot(&e);
        assert!(
            cleaned.len() < view.len(),
            "{} -> {}",
            view.len(),
            cleaned.len()
        );
        // The view after cleaning is enough to rebuild every object.
        let mut other = engine();
        let report = other
            .replay(1, range, cleaned.values().map(|b| &b[..]))
            .expect("replay");
        assert_eq!(report.objects_loaded, 300);
        for i in 0..300u32 {
            let key = i.to_le_bytes();
            let (a, b) = (e.read(1, &key).expect("a"), other.read(1, &key).expect("b"));
            assert_eq!(a.value, b.value);
            assert_eq!(a.version, b.version);
        }
        // Dropping the tablet empties the view.
        assert!(e.drop_tablet(1, range.start));
        assert!(snapshot(&e).is_empty());
        assert_eq!(e.log_of(1, range.start), None);
    }

    #[test]
    fn a_read_is_held_by_the_mark_of_a_walk_that_saw_its_entry() {
        let mut e = engine();
        e.create_tablet(1, HashRange::FULL).expect("tablet");
        let rules = RejectRules::default();
        let held = |e: &Engine, k: u32| e.read_held(1, &k.to_le_bytes()).expect("found").1;
        let put = |e: &mut Engine, k: u32, len: usize| {
            e.write(1, &k.to_le_bytes(), &vec![k as u8; len], &rules)
                .expect("write");
        };
        put(&mut e, 1, 100);
        // Never walked: held only by everything done so far.
        assert_eq!(held(&e, 1), e.log_changes());
        let first = e.log_changes();
        e.note_walk(first);
        assert_eq!(held(&e, 1), first);
        // A later entry in the same segment: key 1 keeps the walk that saw
        // it, key 2 (after every walk) waits for everything.
        put(&mut e, 2, 100);
        assert!(e.log_changes() > first);
        assert_eq!((held(&e, 1), held(&e, 2)), (first, e.log_changes()));
        let second = e.log_changes();
        e.note_walk(second);
        assert_eq!((held(&e, 1), held(&e, 2)), (first, second));
        // A third walk of a longer segment forgets the first length: key 1
        // is then held by the second walk's mark (later, never earlier).
        put(&mut e, 3, 100);
        let third = e.log_changes();
        e.note_walk(third);
        assert_eq!(
            (held(&e, 1), held(&e, 2), held(&e, 3)),
            (second, second, third)
        );
        // A walk with nothing new changes nothing.
        e.note_walk(e.log_changes());
        assert_eq!((held(&e, 2), held(&e, 3)), (second, third));
        // Fill the segment until another opens; walks of the new head do not
        // move the marks of the sealed one.
        let mut k = 4u32;
        let mut sealed = 0;
        while sealed == 0 {
            put(&mut e, k, 1000);
            k += 1;
            sealed = 0;
            e.for_each_segment(|v| sealed += v.sealed as u32);
        }
        let filled = e.log_changes();
        e.note_walk(filled);
        let last_sealed = k - 2; // k - 1 opened the new head
        let sealed_mark = held(&e, last_sealed);
        assert_eq!(sealed_mark, filled);
        for more in 0..3 {
            put(&mut e, 10_000 + more, 100);
            e.note_walk(e.log_changes());
        }
        assert_eq!(held(&e, last_sealed), sealed_mark);
        assert_eq!(held(&e, 10_002), e.log_changes());
        assert!(e.read_held(1, b"absent").is_err());
    }

    #[test]
    fn entries_held_elsewhere_wait_for_nothing_and_later_ones_for_their_walk() {
        let mut e = engine();
        e.create_tablet(1, HashRange::FULL).expect("tablet");
        let rules = RejectRules::default();
        let held = |e: &Engine, k: u32| e.read_held(1, &k.to_le_bytes()).expect("found").1;
        let put = |e: &mut Engine, k: u32| {
            e.write(1, &k.to_le_bytes(), &[k as u8; 600], &rules)
                .expect("write");
        };
        // Enough to seal a segment or more: every segment is marked.
        let mut k = 0u32;
        let mut sealed = 0;
        while sealed < 2 {
            put(&mut e, k);
            k += 1;
            sealed = 0;
            e.for_each_segment(|v| sealed += v.sealed as u32);
        }
        assert!(held(&e, 0) > 0, "never walked: waits for everything");
        e.note_held_elsewhere(1, HashRange::FULL.start)
            .expect("tablet");
        for i in 0..k {
            assert_eq!(held(&e, i), 0, "key {i} was there when marked");
        }
        // A later write waits for everything until a walk sees it, then for
        // that walk; the marked entries keep mark 0 through that walk.
        put(&mut e, k);
        assert_eq!(held(&e, k), e.log_changes());
        let walk = e.log_changes();
        e.note_walk(walk);
        assert_eq!((held(&e, 0), held(&e, k - 1), held(&e, k)), (0, 0, walk));
        assert_eq!(e.note_held_elsewhere(2, 0), Err(EngineError::UnknownTablet));
    }
}
