//! The harness that applies each operation to the engine and to the
//! reference model (a `BTreeMap`, in `reference.rs`) and checks that they
//! agree.

use crate::shared::segment_copies;
use std::collections::BTreeMap;

use insitu_engine::{
    Engine, EngineConfig, EngineError, HashRange, TableId, key_hash, object_entry_bytes_expiring,
};

use crate::ops::{Op, Rules};
use crate::{KEYS, MAX_KEY, MAX_TABLETS, MAX_VALUE, SEGMENT_BYTES, TABLES, key_bytes, value_bytes};

#[path = "reference.rs"]
mod reference;

use reference::{Key, Model, expected_rules};

/// The clock the engine is pinned to at the start (Unix ms).
const START_MS: u64 = 1_000_000;

#[derive(Debug, Default)]
pub struct Counts {
    pub ooms: u64,
    pub splits: u64,
    pub replays: u64,
}

pub struct Harness {
    pub engine: Engine,
    model: Model,
    pub counts: Counts,
    /// With a tight budget, writes may fail with OutOfMemory.
    tight: bool,
}

impl Harness {
    pub fn new(budget_segments: usize) -> Harness {
        let config = EngineConfig {
            segment_bytes: SEGMENT_BYTES,
            memory_budget_bytes: SEGMENT_BYTES * budget_segments,
            max_value_bytes: MAX_VALUE,
        };
        let mut engine = Engine::with_max_key_bytes(config, MAX_KEY).expect("valid config");
        engine.set_clock_ms(Some(START_MS));
        engine
            .create_tablet(TABLES[0], HashRange::FULL)
            .expect("create");
        engine
            .create_tablet(TABLES[1], HashRange::new(0, u64::MAX / 3).expect("range"))
            .expect("create");
        engine
            .create_tablet(
                TABLES[1],
                HashRange::new(u64::MAX / 3 + 1, u64::MAX).expect("range"),
            )
            .expect("create");
        Harness {
            engine,
            model: Model {
                now: START_MS,
                ..Model::default()
            },
            counts: Counts::default(),
            tight: budget_segments < 64,
        }
    }

    /// A mutation's outcome: Ok must match the model's prediction; an
    /// OutOfMemory is allowed only under the tight budget and changes nothing.
    fn allowed_failure(&mut self, got: &EngineError) -> bool {
        let ok = self.tight && *got == EngineError::OutOfMemory;
        self.counts.ooms += u64::from(ok);
        ok
    }

    fn pick_tablet(&self, which: usize) -> (TableId, HashRange) {
        let ts = self.engine.tablets();
        let s = &ts[which % ts.len()];
        (s.table, s.range)
    }

    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::Write {
                t,
                k,
                len,
                fill,
                rules,
            } => {
                self.write(*t, *k, value_bytes(*len, *fill), rules, None);
            }
            Op::Remove { t, k, rules } => {
                let key = (TABLES[*t], key_bytes(*k));
                let current = self.model.current(&key);
                let r = rules.make(current.unwrap_or(0));
                let got = self.engine.remove(key.0, &key.1, &r);
                match (got, expected_rules(&r, current)) {
                    (Ok(v), Ok(())) => {
                        assert_eq!(
                            v,
                            current.unwrap_or(0),
                            "remove returns the removed version"
                        );
                        // An expired object is not removed by a remove (it
                        // is absent already); the sweep removes it.
                        if current.is_some() {
                            self.model.remove(&key);
                        }
                    }
                    // Never OutOfMemory, even under the tight budget.
                    (got, want) => assert_eq!(got.map(|_| ()), want, "remove {key:?}"),
                }
            }
            Op::IncI64 { t, k, delta, rules } => {
                let key = (TABLES[*t], key_bytes(*k));
                let (current, kept) = self.model.live_and_kept(&key);
                let r = rules.make(current.as_ref().map_or(0, |c| c.1));
                let want =
                    expected_rules(&r, current.as_ref().map(|c| c.1)).and_then(
                        |()| match &current {
                            None => Ok(*delta),
                            Some((v, _)) if v.len() == 8 => {
                                Ok(i64::from_le_bytes(v[..].try_into().expect("8"))
                                    .wrapping_add(*delta))
                            }
                            Some((v, _)) => Err(EngineError::NotANumber { len: v.len() }),
                        },
                    );
                match (self.engine.increment_i64(key.0, &key.1, *delta, &r), want) {
                    (Ok((n, v)), Ok(w)) => {
                        assert_eq!(n, w);
                        self.model
                            .record_expiring(key, n.to_le_bytes().to_vec(), v, kept);
                    }
                    (Err(g), Ok(_)) if self.allowed_failure(&g) => {}
                    (got, want) => assert_eq!(got.map(|g| g.0), want, "increment_i64 {key:?}"),
                }
            }
            Op::IncF64 { t, k, delta, rules } => {
                let key = (TABLES[*t], key_bytes(*k));
                let delta = f64::from(*delta) / 4.0;
                let (current, kept) = self.model.live_and_kept(&key);
                let r = rules.make(current.as_ref().map_or(0, |c| c.1));
                let want =
                    expected_rules(&r, current.as_ref().map(|c| c.1)).and_then(
                        |()| match &current {
                            None => Ok(0.0 + delta),
                            Some((v, _)) if v.len() == 8 => {
                                Ok(f64::from_le_bytes(v[..].try_into().expect("8")) + delta)
                            }
                            Some((v, _)) => Err(EngineError::NotANumber { len: v.len() }),
                        },
                    );
                match (self.engine.increment_f64(key.0, &key.1, delta, &r), want) {
                    (Ok((n, v)), Ok(w)) => {
                        assert_eq!(n.to_bits(), w.to_bits());
                        self.model
                            .record_expiring(key, n.to_le_bytes().to_vec(), v, kept);
                    }
                    (Err(g), Ok(_)) if self.allowed_failure(&g) => {}
                    (got, want) => assert_eq!(
                        got.map(|g| g.0.to_bits()),
                        want.map(f64::to_bits),
                        "increment_f64 {key:?}"
                    ),
                }
            }
            Op::Read { t, k } => self.check_read(TABLES[*t], &key_bytes(*k)),
            Op::Install {
                t,
                k,
                len,
                higher,
                d,
            } => {
                let key = (TABLES[*t], key_bytes(*k));
                let hash = key_hash(key.0, &key.1);
                let range = self.engine.tablet_for(key.0, hash).expect("covered");
                let next = self
                    .engine
                    .tablet_stats(key.0, range.start)
                    .expect("stats")
                    .next_version;
                let value = value_bytes(*len, *d);
                if *higher {
                    let version = next + u64::from(*d);
                    match self.engine.install(key.0, &key.1, &value, version) {
                        Ok(()) => {
                            self.model.record(key.clone(), value, version);
                            let after = self
                                .engine
                                .tablet_stats(key.0, range.start)
                                .expect("stats")
                                .next_version;
                            assert_eq!(
                                after,
                                version + 1,
                                "install raises the counter above the version"
                            );
                        }
                        Err(g) => assert!(self.allowed_failure(&g), "install: {g:?}"),
                    }
                } else if let Some(&(_, current)) = self.model.objects.get(&key) {
                    // Not newer than what is held (expired or not): ignored.
                    let version = current.saturating_sub(u64::from(*d));
                    assert_eq!(self.engine.install(key.0, &key.1, &value, version), Ok(()));
                }
            }
            Op::RaiseVersion { which, by } => {
                let (table, range) = self.pick_tablet(*which);
                let next = self
                    .engine
                    .tablet_stats(table, range.start)
                    .expect("stats")
                    .next_version;
                match self
                    .engine
                    .raise_version(table, range.start, next + u64::from(*by))
                {
                    Ok(()) => {
                        let after = self
                            .engine
                            .tablet_stats(table, range.start)
                            .expect("stats")
                            .next_version;
                        assert_eq!(after, next + u64::from(*by));
                    }
                    Err(g) => assert!(self.allowed_failure(&g), "raise_version: {g:?}"),
                }
            }
            Op::Clean => {
                let before = self.engine.memory();
                let stats = self.engine.clean();
                let after = self.engine.memory();
                assert_eq!(
                    before.live_bytes, after.live_bytes,
                    "cleaning changes no live data"
                );
                assert!(
                    after.segment_bytes <= before.segment_bytes,
                    "cleaning never holds more memory: {stats:?}"
                );
            }
            Op::Split { t, at } => {
                if self.engine.tablets().len() >= MAX_TABLETS {
                    return;
                }
                let table = TABLES[*t];
                let range = self.engine.tablet_for(table, *at).expect("covered");
                let next = self
                    .engine
                    .tablet_stats(table, range.start)
                    .expect("stats")
                    .next_version;
                match self.engine.split_tablet(table, *at) {
                    Ok(()) => {
                        assert!(*at != range.start);
                        let lower = self
                            .engine
                            .tablet_stats(table, range.start)
                            .expect("lower half");
                        let upper = self.engine.tablet_stats(table, *at).expect("upper half");
                        assert_eq!((lower.range.end, upper.range.end), (*at - 1, range.end));
                        assert_eq!(
                            (lower.next_version, upper.next_version),
                            (next, next),
                            "both halves keep the counter"
                        );
                        self.counts.splits += 1;
                    }
                    Err(EngineError::BadTablet(_)) => assert_eq!(*at, range.start),
                    Err(g) => assert!(self.allowed_failure(&g), "split: {g:?}"),
                }
            }
            Op::DropReplay { which } => {
                let (table, range) = self.pick_tablet(*which);
                let before = self.engine.tablet_stats(table, range.start).expect("stats");
                let segments = segment_copies(&self.engine, table, range.start);
                assert!(self.engine.drop_tablet(table, range.start));
                assert!(
                    !self.engine.drop_tablet(table, range.start),
                    "dropped twice"
                );
                match self
                    .engine
                    .replay(table, range, segments.iter().map(|s| &s[..]))
                {
                    Ok(report) => {
                        assert!(
                            report.corrupt.is_empty(),
                            "clean segments reported corrupt: {:?}",
                            report.corrupt
                        );
                        let after = self
                            .engine
                            .tablet_stats(table, range.start)
                            .expect("replayed");
                        assert_eq!(report.objects_loaded, before.object_count);
                        assert_eq!(
                            (after.object_count, after.live_bytes),
                            (before.object_count, before.live_bytes)
                        );
                        assert_eq!(
                            after.next_version, before.next_version,
                            "replay restores the version counter"
                        );
                        self.counts.replays += 1;
                    }
                    Err(g) => {
                        assert!(self.allowed_failure(&g), "replay: {g:?}");
                        // Nothing of the tablet may be left; put it back for the rest of the run.
                        assert!(self.engine.tablet_stats(table, range.start).is_none());
                        self.forget(table, range);
                        self.engine.create_tablet(table, range).expect("recreate");
                    }
                }
            }
            Op::DropCreate { which } => {
                let (table, range) = self.pick_tablet(*which);
                assert!(self.engine.drop_tablet(table, range.start));
                self.forget(table, range);
                self.engine.create_tablet(table, range).expect("recreate");
            }
            Op::Scan { which } => {
                let (table, range) = self.pick_tablet(*which);
                self.check_tablet_contents(table, range);
            }
            Op::WriteExpiring {
                t,
                k,
                len,
                fill,
                ttl_ms,
                rules,
            } => {
                let deadline = self.model.now + u64::from(*ttl_ms);
                self.write(*t, *k, value_bytes(*len, *fill), rules, Some(deadline));
            }
            Op::Advance { ms } => {
                self.model.now += u64::from(*ms);
                self.engine.set_clock_ms(Some(self.model.now));
            }
            Op::Sweep { max } => {
                let sweep = self
                    .engine
                    .sweep_expired(usize::from(*max), 2 * SEGMENT_BYTES as u64);
                assert!(sweep.expired.len() <= usize::from(*max));
                for o in sweep.expired {
                    let key = (o.table, o.key);
                    assert!(
                        self.model.expired(&key),
                        "swept a live key {key:?}: model deadline {:?}, version {:?}, now {}, named version {}",
                        self.model.deadlines.get(&key),
                        self.model.objects.get(&key).map(|o| o.1),
                        self.model.now,
                        o.version
                    );
                    assert_eq!(
                        self.model.objects.get(&key).map(|o| o.1),
                        Some(o.version),
                        "swept {key:?} at its version"
                    );
                    match self.engine.expire(key.0, &key.1, o.version) {
                        Ok(true) => self.model.remove(&key),
                        Ok(false) => panic!("a due object named by the sweep was not removed"),
                        Err(g) => panic!("expire {key:?}: {g:?}"),
                    }
                }
            }
        }
    }

    /// A write (`deadline` None) or a write with a deadline, checked
    /// against the model's prediction.
    fn write(&mut self, t: usize, k: u8, value: Vec<u8>, rules: &Rules, deadline: Option<u64>) {
        let key = (TABLES[t], key_bytes(k));
        let r = rules.make(self.model.current(&key).unwrap_or(0));
        let got = match deadline {
            None => self.engine.write(key.0, &key.1, &value, &r),
            Some(d) => self.engine.write_expiring(key.0, &key.1, &value, d, &r),
        };
        let want = if value.len() > MAX_VALUE {
            Err(EngineError::ValueTooLarge {
                len: value.len(),
                max: MAX_VALUE,
            })
        } else {
            expected_rules(&r, self.model.current(&key))
        };
        match (got, want) {
            (Ok(v), Ok(())) => self
                .model
                .record_expiring(key, value, v, deadline.unwrap_or(0)),
            (Err(g), Ok(())) if self.allowed_failure(&g) => {}
            (got, want) => assert_eq!(got.map(|_| ()), want, "write {key:?} ({deadline:?})"),
        }
    }

    /// Sweep until every due object is removed (a whole round of the
    /// cursor finds nothing more): nothing expired may be left behind.
    ///
    /// Two empty calls that wrapped, back to back: a call that resumes in
    /// the middle of a tablet (where a bounded sweep stopped) wraps without
    /// reading that tablet's earlier segments, nor the resumed segment's
    /// earlier entries, which may have fallen due since; the call after it
    /// starts at a tablet's first segment and covers every tablet.
    pub fn sweep_all(&mut self) {
        let mut quiet = 0;
        for _ in 0..1000 {
            let sweep = self.engine.sweep_expired(usize::MAX, u64::MAX);
            if sweep.expired.is_empty() && sweep.wrapped {
                quiet += 1;
                if quiet == 2 {
                    break;
                }
                continue;
            }
            quiet = 0;
            for o in sweep.expired {
                let key = (o.table, o.key);
                assert_eq!(self.engine.expire(key.0, &key.1, o.version), Ok(true));
                self.model.remove(&key);
            }
        }
        let due: Vec<&Key> = self
            .model
            .objects
            .keys()
            .filter(|k| self.model.expired(k))
            .collect();
        assert!(due.is_empty(), "the sweep never named {due:?}");
    }

    /// A dropped tablet's data is gone, and a new tablet restarts versions.
    fn forget(&mut self, table: TableId, range: HashRange) {
        let keys: Vec<Key> = self
            .model
            .in_range(table, range)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.model.remove(&k);
        }
        self.model
            .highest
            .retain(|(t, k), _| !(*t == table && range.contains(key_hash(*t, k))));
        self.model
            .deadlines
            .retain(|(t, k), _| !(*t == table && range.contains(key_hash(*t, k))));
    }

    pub fn check_read(&self, table: TableId, key: &[u8]) {
        let got = self
            .engine
            .read(table, key)
            .map(|o| (o.value.to_vec(), o.version));
        let want = self
            .model
            .live(&(table, key.to_vec()))
            .cloned()
            .ok_or(EngineError::ObjectDoesntExist);
        assert_eq!(got, want, "read of {key:?} in table {table}");
    }

    /// All three visits and `extract` return exactly the model's objects.
    pub fn check_tablet_contents(&self, table: TableId, range: HashRange) {
        let want: BTreeMap<Vec<u8>, (Vec<u8>, u64)> = self
            .model
            .live_in_range(table, range)
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect();
        let mut by_log = BTreeMap::new();
        self.engine
            .for_each_log(table, range.start, |o| {
                assert!(
                    by_log
                        .insert(o.key.to_vec(), (o.value.to_vec(), o.version))
                        .is_none(),
                    "key twice in log walk"
                )
            })
            .expect("log walk");
        assert_eq!(by_log, want, "for_each_log");
        let mut by_index = BTreeMap::new();
        self.engine
            .for_each_index(table, range.start, |o| {
                assert!(
                    by_index
                        .insert(o.key.to_vec(), (o.value.to_vec(), o.version))
                        .is_none()
                )
            })
            .expect("index walk");
        assert_eq!(by_index, want, "for_each_index");
        let extracted: BTreeMap<Vec<u8>, (Vec<u8>, u64)> = self
            .engine
            .extract(table, range.start)
            .expect("extract")
            .into_iter()
            .map(|(k, v, ver, _)| (k, (v, ver)))
            .collect();
        assert_eq!(extracted, want, "extract");
        let keys: Vec<Vec<u8>> = (0..KEYS).map(key_bytes).collect();
        let mut looked = 0;
        self.engine
            .lookup_many(table, range.start, keys.iter().map(|k| &k[..]), |k, o| {
                looked += 1;
                assert_eq!(
                    o.map(|o| (o.value.to_vec(), o.version)),
                    want.get(k).cloned(),
                    "lookup_many {k:?}"
                );
            })
            .expect("lookup_many");
        assert_eq!(looked, keys.len());
    }

    /// Per-tablet figures kept on every operation equal the model's.
    pub fn check_stats(&self) {
        self.engine.check_invariants();
        let mut live_total = 0;
        for s in self.engine.tablets() {
            let (count, live) = self.model.in_range(s.table, s.range).fold(
                (0u64, 0u64),
                |(c, l), (key, (v, ver))| {
                    let deadline = self.model.deadlines.get(key).copied().unwrap_or(0);
                    let bytes = object_entry_bytes_expiring(key.1.len(), v.len(), *ver, deadline);
                    (c + 1, l + bytes as u64)
                },
            );
            assert_eq!(
                (s.object_count, s.live_bytes),
                (count, live),
                "stats of tablet {:?} {:?}",
                s.table,
                s.range
            );
            assert_eq!(s.segment_bytes, s.segments * SEGMENT_BYTES as u64);
            live_total += live;
        }
        let m = self.engine.memory();
        assert_eq!(m.live_bytes, live_total);
        assert!(m.segment_bytes <= m.budget_bytes, "over budget: {m:?}");
        assert_eq!(
            self.model.objects.len() as u64,
            self.engine
                .tablets()
                .iter()
                .map(|s| s.object_count)
                .sum::<u64>()
        );
    }
}
