//! Limits and edge cases: key and value sizes, the memory budget, tablet
//! management errors, reject rules and increments.

mod shared;

use shared::{ANY, engine_of};

use insitu_engine::{
    Engine, EngineConfig, EngineError, HashRange, MAX_KEY_BYTES, RejectRules, object_entry_bytes,
};

const T: u64 = 5;

fn small(budget_segments: usize) -> Engine {
    engine_of(4096, 4096 * budget_segments, 512, &[T])
}

#[test]
fn key_sizes() {
    let mut e = Engine::new(EngineConfig::default()).expect("default config");
    e.create_tablet(T, HashRange::FULL).expect("tablet");
    let largest = vec![7u8; MAX_KEY_BYTES];
    let too_large = vec![7u8; MAX_KEY_BYTES + 1];
    let v = e
        .write(T, &largest, b"v", &ANY)
        .expect("a key of the maximum size");
    assert_eq!(e.read(T, &largest).expect("read").version, v);
    let err = EngineError::KeyTooLarge {
        len: MAX_KEY_BYTES + 1,
        max: MAX_KEY_BYTES,
    };
    assert_eq!(e.write(T, &too_large, b"v", &ANY), Err(err.clone()));
    assert_eq!(e.read(T, &too_large).map(|o| o.version), Err(err.clone()));
    assert_eq!(e.remove(T, &too_large, &ANY), Err(err.clone()));
    assert_eq!(e.increment_i64(T, &too_large, 1, &ANY), Err(err));
    for result in [
        e.write(T, b"", b"v", &ANY).map(|_| ()),
        e.read(T, b"").map(|_| ()),
        e.remove(T, b"", &ANY).map(|_| ()),
        e.install(T, b"", b"v", 3),
    ] {
        assert_eq!(result, Err(EngineError::EmptyKey));
    }
}

#[test]
fn value_sizes() {
    let mut e = Engine::new(EngineConfig::default()).expect("default config");
    e.create_tablet(T, HashRange::FULL).expect("tablet");
    let max = EngineConfig::default().max_value_bytes;
    e.write(T, b"big", &vec![1u8; max], &ANY)
        .expect("a value of the maximum size");
    assert_eq!(e.read(T, b"big").expect("read").value.len(), max);
    assert_eq!(
        e.write(T, b"big", &vec![1u8; max + 1], &ANY),
        Err(EngineError::ValueTooLarge { len: max + 1, max })
    );
    // Zero-length values are objects like any other.
    let v = e.write(T, b"empty", b"", &ANY).expect("empty value");
    let o = e.read(T, b"empty").expect("read");
    assert_eq!((o.value, o.version), (&b""[..], v));
    let big = e.read(T, b"big").expect("read").version;
    assert_eq!(
        e.tablet_stats(T, 0).expect("stats").live_bytes,
        (object_entry_bytes(3, max, big) + object_entry_bytes(5, 0, v)) as u64
    );
}

#[test]
fn inconsistent_configs_are_refused() {
    let ok = EngineConfig {
        segment_bytes: 4096,
        memory_budget_bytes: 1 << 20,
        max_value_bytes: 512,
    };
    assert!(Engine::with_max_key_bytes(ok.clone(), 64).is_ok());
    assert!(
        matches!(Engine::new(ok.clone()), Err(EngineError::BadTablet(_))),
        "a 64 KiB key does not fit in 4 KiB"
    );
    let value_too_big = EngineConfig {
        max_value_bytes: 4000,
        ..ok.clone()
    };
    assert!(matches!(
        Engine::with_max_key_bytes(value_too_big, 64),
        Err(EngineError::BadTablet(_))
    ));
    let budget_too_small = EngineConfig {
        memory_budget_bytes: 4095,
        ..ok.clone()
    };
    assert!(matches!(
        Engine::with_max_key_bytes(budget_too_small, 64),
        Err(EngineError::BadTablet(_))
    ));
    assert!(matches!(
        Engine::with_max_key_bytes(ok.clone(), 0),
        Err(EngineError::BadTablet(_))
    ));
    assert!(matches!(
        Engine::with_max_key_bytes(ok.clone(), MAX_KEY_BYTES + 1),
        Err(EngineError::BadTablet(_))
    ));
    // An index slot's reference holds a 22-bit offset: 4 MiB segments at most.
    let four_mib = EngineConfig {
        segment_bytes: 4 << 20,
        memory_budget_bytes: 64 << 20,
        ..ok.clone()
    };
    assert!(Engine::with_max_key_bytes(four_mib.clone(), 64).is_ok());
    let bigger = EngineConfig {
        segment_bytes: (4 << 20) + 1,
        ..four_mib
    };
    assert!(matches!(
        Engine::with_max_key_bytes(bigger, 64),
        Err(EngineError::BadTablet(why)) if why.contains("22-bit")
    ));
}

/// An index slot's reference holds a 14-bit segment slot: one tablet holds
/// at most 16,384 segments. The next is refused as out of memory, with the
/// budget far from full, and the tablet stays whole and readable.
#[test]
fn a_tablet_holds_at_most_16384_segments() {
    let config = EngineConfig {
        segment_bytes: 128,
        memory_budget_bytes: 64 << 20,
        max_value_bytes: 16,
    };
    let mut e = Engine::with_max_key_bytes(config, 16).expect("config");
    e.create_tablet(T, HashRange::FULL).expect("tablet");
    let mut written = 0u64;
    let refused = loop {
        match e.write(T, &written.to_le_bytes(), &[1; 16], &ANY) {
            Ok(_) => written += 1,
            Err(err) => break err,
        }
        assert!(written < 100_000, "never refused");
    };
    assert_eq!(refused, EngineError::OutOfMemory);
    let stats = e.tablet_stats(T, 0).expect("stats");
    assert_eq!(stats.segments, 16_384);
    assert!(e.memory().segment_bytes < e.memory().budget_bytes / 2);
    for i in 0..written {
        assert!(e.read(T, &i.to_le_bytes()).is_ok(), "key {i}");
    }
    e.check_invariants();
}

#[test]
fn a_full_budget_refuses_writes_keeps_reads_and_recovers_after_remove_and_clean() {
    let mut e = small(16);
    let mut written = Vec::new();
    let err = loop {
        let i = written.len();
        let key = format!("key-{i}").into_bytes();
        match e.write(T, &key, &[i as u8; 200], &ANY) {
            Ok(v) => written.push((key, v)),
            Err(err) => break err,
        }
        assert!(i < 10_000, "the budget never filled");
    };
    assert_eq!(err, EngineError::OutOfMemory);
    let m = e.memory();
    assert!(m.segment_bytes <= m.budget_bytes);
    assert!(
        m.utilization > 0.7,
        "the budget is filled with live data: {m:?}"
    );
    // Reads keep working, and a failed write changed nothing.
    for (key, v) in &written {
        assert_eq!(e.read(T, key).expect("read").version, *v);
    }
    assert_eq!(
        e.tablet_stats(T, 0).expect("stats").object_count,
        written.len() as u64
    );
    assert_eq!(
        e.write(T, b"one more", &[0; 200], &ANY),
        Err(EngineError::OutOfMemory),
        "still full"
    );
    // Removing works even now (tombstones may use a reserve), and cleaning frees room.
    for (key, _) in written.iter().step_by(2) {
        e.remove(T, key, &ANY).expect("remove with a full budget");
    }
    let stats = e.clean();
    assert!(
        stats.segments_cleaned > 0 && stats.bytes_freed > 0,
        "{stats:?}"
    );
    for i in 0..written.len() / 4 {
        e.write(T, format!("new-{i}").as_bytes(), &[1; 200], &ANY)
            .expect("room again after remove + clean");
    }
    for (key, v) in written.iter().skip(1).step_by(2) {
        assert_eq!(e.read(T, key).expect("survivor").version, *v);
    }
    e.check_invariants();
}

#[test]
fn writes_clean_automatically_when_the_budget_is_full() {
    let mut e = small(16);
    // Overwrite a working set well below the budget many times: without
    // automatic cleaning this would exhaust the budget many times over.
    for round in 0..200u32 {
        for i in 0..20u32 {
            e.write(T, &i.to_le_bytes(), &[round as u8; 300], &ANY)
                .expect("overwrite");
        }
    }
    assert!(e.cleaner_totals().segments_cleaned > 100);
    assert!(e.memory().segment_bytes <= e.memory().budget_bytes);
    e.check_invariants();
}

/// Steady-state random overwrites under a budget close to the live data
/// keep memory utilisation above 0.85.
#[test]
fn overwrite_workload_keeps_utilisation_high() {
    let segment_bytes = 64 * 1024;
    let objects = 20_000u64;
    // Versions stay below 2^21 here (3 bytes at most).
    let live = objects as usize * object_entry_bytes(8, 100, (1 << 21) - 1);
    // The budget covers the index too: 20,000 entries take 32,768 buckets of
    // 8 bytes plus a control byte each, and 16 trailing control bytes.
    let index_bytes = 32_768 * 9 + 16;
    let budget = (live as f64 / 0.9) as usize + 4 * segment_bytes + index_bytes;
    let mut e = engine_of(segment_bytes, budget, 1024, &[T]);
    for i in 0..objects {
        e.write(T, &i.to_le_bytes(), &[0; 100], &ANY).expect("load");
    }
    let mut rng = insitu_testkit::rng(88172645463325252);
    for _ in 0..3 * objects {
        e.write(T, &rng.u64(0..objects).to_le_bytes(), &[1; 100], &ANY)
            .expect("overwrite under a tight budget");
    }
    let m = e.memory();
    let exact: usize = (0..objects)
        .map(|i| {
            let o = e.read(T, &i.to_le_bytes()).expect("live");
            object_entry_bytes(8, 100, o.version)
        })
        .sum();
    assert_eq!(m.live_bytes, exact as u64);
    assert!(exact <= live);
    assert!(m.utilization >= 0.85, "utilisation {m:?}");
    assert_eq!(m.index_bytes, index_bytes as u64);
}

#[test]
fn tablet_management_errors() {
    let mut e = small(64);
    let half = HashRange::new(0, u64::MAX / 2).expect("range");
    assert!(
        matches!(e.create_tablet(T, half), Err(EngineError::BadTablet(_))),
        "overlaps FULL"
    );
    assert!(
        matches!(e.split_tablet(T, 0), Err(EngineError::BadTablet(_))),
        "split at the start"
    );
    assert_eq!(
        e.write(T + 1, b"k", b"v", &ANY),
        Err(EngineError::UnknownTablet)
    );
    assert_eq!(
        e.read(T + 1, b"k").map(|_| ()),
        Err(EngineError::UnknownTablet)
    );
    assert!(!e.drop_tablet(T, 1));
    assert_eq!(
        e.for_each_log(T, 1, |_| {}),
        Err(EngineError::UnknownTablet)
    );
    e.create_tablet(T + 1, half).expect("disjoint from nothing");
    e.create_tablet(
        T + 1,
        HashRange::new(u64::MAX / 2 + 1, u64::MAX).expect("range"),
    )
    .expect("adjacent");
    assert_eq!(
        e.tablets()
            .iter()
            .map(|s| (s.table, s.range.start))
            .collect::<Vec<_>>(),
        vec![(T, 0), (T + 1, 0), (T + 1, u64::MAX / 2 + 1)]
    );
    // Dropping returns the tablet's memory to the budget.
    for i in 0..200u32 {
        e.write(T, &i.to_le_bytes(), &[0; 100], &ANY)
            .expect("write");
    }
    assert!(e.memory().segment_bytes > 0);
    assert!(e.drop_tablet(T, 0));
    assert_eq!(e.memory().segment_bytes, 0);
    assert_eq!(
        e.read(T, &0u32.to_le_bytes()).map(|_| ()),
        Err(EngineError::UnknownTablet)
    );
}

#[test]
fn split_keeps_objects_on_both_sides_and_scans_stay_per_tablet() {
    let mut e = small(256);
    for i in 0..300u32 {
        e.write(T, &i.to_le_bytes(), &i.to_le_bytes(), &ANY)
            .expect("write");
    }
    let next = e.tablet_stats(T, 0).expect("stats").next_version;
    let at = 1u64 << 62; // a quarter: the lower part moves
    e.split_tablet(T, at).expect("split");
    let lower = e.tablet_stats(T, 0).expect("lower");
    let upper = e.tablet_stats(T, at).expect("upper");
    assert_eq!(lower.object_count + upper.object_count, 300);
    assert!(lower.object_count > 0 && upper.object_count > lower.object_count);
    assert_eq!((lower.next_version, upper.next_version), (next, next));
    for i in 0..300u32 {
        assert_eq!(
            e.read(T, &i.to_le_bytes()).expect("read").value,
            &i.to_le_bytes()
        );
    }
    let mut seen = 0;
    e.for_each_log(T, 0, |o| {
        assert!(insitu_engine::key_hash(T, o.key) < at);
        seen += 1;
    })
    .expect("walk");
    assert_eq!(seen, lower.object_count);
    // Writes after the split continue above the inherited counter on both sides.
    for i in 0..300u32 {
        assert!(e.write(T, &i.to_le_bytes(), b"x", &ANY).expect("write") >= next);
    }
    e.check_invariants();
}

#[test]
fn reject_rules() {
    let mut e = small(64);
    let v1 = e.write(T, b"k", b"1", &ANY).expect("write");
    let exists = RejectRules {
        exists: true,
        ..ANY
    };
    let doesnt = RejectRules {
        doesnt_exist: true,
        ..ANY
    };
    assert_eq!(
        e.write(T, b"k", b"2", &exists),
        Err(EngineError::ObjectExists { version: v1 })
    );
    assert_eq!(
        e.write(T, b"absent", b"2", &doesnt),
        Err(EngineError::ObjectDoesntExist)
    );
    assert_eq!(
        e.remove(T, b"absent", &doesnt),
        Err(EngineError::ObjectDoesntExist)
    );
    assert_eq!(
        e.remove(T, b"absent", &ANY),
        Ok(0),
        "removing an absent key is a no-op"
    );
    let le = RejectRules {
        version_le_given: true,
        given_version: v1,
        ..ANY
    };
    assert_eq!(
        e.write(T, b"k", b"2", &le),
        Err(EngineError::WrongVersion { version: v1 })
    );
    let ne = RejectRules {
        version_ne_given: true,
        given_version: v1 + 1,
        ..ANY
    };
    assert_eq!(
        e.remove(T, b"k", &ne),
        Err(EngineError::WrongVersion { version: v1 })
    );
    // A compare-and-swap on the current version succeeds and returns the new version.
    let cas = RejectRules {
        version_ne_given: true,
        given_version: v1,
        ..ANY
    };
    let v2 = e.write(T, b"k", b"2", &cas).expect("cas");
    assert!(v2 > v1);
    assert_eq!(
        e.write(T, b"k", b"3", &cas),
        Err(EngineError::WrongVersion { version: v2 })
    );
    assert_eq!(e.read(T, b"k").expect("read").value, b"2");
    // Exists-only on an absent key passes: it is "create".
    assert!(e.write(T, b"fresh", b"x", &exists).is_ok());
}

#[test]
fn increments() {
    let mut e = small(64);
    let (n, v1) = e
        .increment_i64(T, b"counter", 5, &ANY)
        .expect("absent counts as 0");
    assert_eq!(n, 5);
    let (n, v2) = e.increment_i64(T, b"counter", -7, &ANY).expect("increment");
    assert_eq!(n, -2);
    assert!(v2 > v1);
    assert_eq!(
        e.read(T, b"counter").expect("read").value,
        (-2i64).to_le_bytes()
    );
    let (f, _) = e
        .increment_f64(T, b"float", 1.5, &ANY)
        .expect("absent counts as 0.0");
    assert_eq!(f, 1.5);
    assert_eq!(
        e.increment_f64(T, b"float", 0.25, &ANY)
            .expect("increment")
            .0,
        1.75
    );
    e.write(T, b"text", b"hello", &ANY).expect("write");
    assert_eq!(
        e.increment_i64(T, b"text", 1, &ANY),
        Err(EngineError::NotANumber { len: 5 })
    );
    assert_eq!(
        e.increment_f64(T, b"text", 1.0, &ANY),
        Err(EngineError::NotANumber { len: 5 })
    );
    let exists = RejectRules {
        exists: true,
        ..ANY
    };
    assert_eq!(
        e.increment_i64(T, b"counter", 1, &exists),
        Err(EngineError::ObjectExists { version: v2 })
    );
}

#[test]
fn install_and_raise_version() {
    let mut e = small(64);
    e.install(T, b"k", b"migrated", 100).expect("install");
    let o = e.read(T, b"k").expect("read");
    assert_eq!((o.value, o.version), (&b"migrated"[..], 100));
    e.install(T, b"k", b"older", 50)
        .expect("older install is ignored");
    assert_eq!(e.read(T, b"k").expect("read").value, b"migrated");
    assert!(e.write(T, b"k", b"new", &ANY).expect("write") > 100);
    e.raise_version(T, 0, 1000).expect("raise");
    assert_eq!(e.tablet_stats(T, 0).expect("stats").next_version, 1000);
    assert_eq!(e.write(T, b"other", b"x", &ANY), Ok(1000));
    assert_eq!(e.raise_version(T, 7, 5), Err(EngineError::UnknownTablet));
}

#[test]
fn lookup_many_reports_absent_and_foreign_keys() {
    let mut e = small(64);
    e.split_tablet(T, 1 << 63).expect("split");
    for i in 0..50u32 {
        e.write(T, &i.to_le_bytes(), b"v", &ANY).expect("write");
    }
    let keys: Vec<Vec<u8>> = (0..60u32)
        .map(|i| i.to_le_bytes().to_vec())
        .chain([Vec::new()])
        .collect();
    let mut found = 0;
    let mut absent = 0;
    e.lookup_many(T, 0, keys.iter().map(|k| &k[..]), |k, o| match o {
        Some(o) => {
            assert!(insitu_engine::key_hash(T, k) < 1 << 63);
            assert_eq!(o.key, k);
            found += 1;
        }
        None => absent += 1,
    })
    .expect("lookup");
    assert_eq!(found, e.tablet_stats(T, 0).expect("stats").object_count);
    assert_eq!(found + absent, 61);
}
