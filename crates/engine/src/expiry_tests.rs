//! Tests of objects with deadlines: the entry bytes, absence after the
//! deadline in every read and visit, reject rules, the sweep and `expire`,
//! and the deadline kept through cleaning, splits, extraction and replay.

use crate::entry::{self, KIND_OBJECT, KIND_TOMBSTONE};
use crate::test_engine::engine_with;
use crate::{Engine, EngineError, HashRange, RejectRules};

const T: u64 = 9;
/// A fixed "now": the tests pin the clock.
const NOW: u64 = 1_700_000_000_000;

fn engine() -> Engine {
    let mut e = engine_with(4096, 256, 512, &[T]);
    e.set_clock_ms(Some(NOW));
    e
}

fn none() -> RejectRules {
    RejectRules::default()
}

fn keys_by_log(e: &Engine) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    e.for_each_log(T, 0, |o| keys.push(o.key.to_vec()))
        .expect("log");
    keys.sort();
    keys
}

#[test]
fn the_deadline_is_in_the_entry_and_survives_parsing() {
    let mut buf = Vec::with_capacity(entry::max_entry_bytes(3, 5));
    let len = entry::append_parts(&mut buf, KIND_OBJECT, 7, 300, NOW, b"key", b"value", &[]);
    // crc 4, flags 1, version 2, deadline 8, key_len 1, value_len 1.
    assert_eq!(len, 4 + 1 + 2 + 8 + 1 + 1 + 3 + 5);
    assert_eq!(buf[4], KIND_OBJECT | 1 << 2 | 0x40);
    assert_eq!(&buf[7..15], &NOW.to_le_bytes());
    let o = entry::object_at(&buf, 0);
    assert_eq!(
        (o.key, o.value, o.version, o.expires_at_ms),
        (&b"key"[..], &b"value"[..], 300, NOW)
    );
    assert_eq!(entry::key_at(&buf, 0), b"key");
    assert_eq!(entry::expires_at(&buf, 0), NOW);
    assert_eq!(entry::len_at(&buf, 0), len);
    let p = entry::parse(&buf, 0, 7, 64, 512).expect("parses");
    assert_eq!((p.expires_at_ms, p.key, p.next), (NOW, &b"key"[..], len));
    // An object without one keeps its old bytes: no bit, no field.
    let mut plain = Vec::with_capacity(entry::max_entry_bytes(3, 5));
    entry::append(&mut plain, KIND_OBJECT, 7, 300, b"key", b"value");
    assert_eq!(plain.len(), len - 8);
    assert_eq!(entry::object_at(&plain, 0).expires_at_ms, 0);
}

#[test]
fn replay_refuses_a_deadline_on_a_tombstone_or_a_zero_deadline() {
    // A tombstone built by hand with the deadline bit (and a valid CRC):
    // the writer never makes one, so replay must not trust its lengths.
    let mut buf = Vec::with_capacity(64);
    entry::append_parts(&mut buf, KIND_OBJECT, 7, 5, 1, b"k", &[0; 8], &[]);
    buf[4] = (buf[4] & !0x03) | KIND_TOMBSTONE; // now "a tombstone with a deadline"
    assert_refused_resealed(&mut buf);
    // A deadline of 0 with the bit set is not a form the writer makes.
    let mut buf = Vec::with_capacity(64);
    entry::append_parts(&mut buf, KIND_OBJECT, 7, 5, 1, b"k", b"v", &[]);
    buf[7..15].copy_from_slice(&0u64.to_le_bytes());
    assert_refused_resealed(&mut buf);
}

/// With its CRC made right again, the entry `buf` is still refused by `parse`.
fn assert_refused_resealed(buf: &mut [u8]) {
    let crc = recrc(buf);
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        entry::parse(buf, 0, 7, 64, 512),
        Err(entry::Bad::Stop(_))
    ));
}

/// The CRC of one whole entry of table 7 (the dead bit is 0 here).
fn recrc(buf: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&7u64.to_le_bytes());
    crc32c::crc32c_append(crc, &buf[4..])
}

#[test]
fn an_expired_object_is_absent_to_reads_visits_and_rules() {
    let mut e = engine();
    e.write_expiring(T, b"soon", b"1", NOW + 10, &none())
        .expect("write");
    e.write(T, b"kept", b"2", &none()).expect("write");
    let o = e.read(T, b"soon").expect("live before its deadline");
    assert_eq!(o.expires_at_ms, NOW + 10);
    assert_eq!(keys_by_log(&e), vec![b"kept".to_vec(), b"soon".to_vec()]);

    e.set_clock_ms(Some(NOW + 10)); // the deadline itself is expired
    assert_eq!(e.read(T, b"soon"), Err(EngineError::ObjectDoesntExist));
    assert_eq!(keys_by_log(&e), vec![b"kept".to_vec()]);
    let mut by_index = Vec::new();
    e.for_each_index(T, 0, |o| by_index.push(o.key.to_vec()))
        .expect("index");
    assert_eq!(by_index, vec![b"kept".to_vec()]);
    let mut found = Vec::new();
    e.lookup_many(T, 0, [&b"soon"[..], b"kept"], |k, o| {
        found.push((k.to_vec(), o.is_some()))
    })
    .expect("lookup");
    assert_eq!(
        found,
        vec![(b"soon".to_vec(), false), (b"kept".to_vec(), true)]
    );
    let mut scanned = 0;
    for i in 0..e.scan_segments(T, 0).expect("segments") {
        e.scan_log_segment(T, 0, i, |_| scanned += 1).expect("scan");
    }
    assert_eq!(scanned, 1);
    let hash = crate::key_hash(T, b"soon");
    assert_eq!(e.objects_with_hash(T, 0, hash, |_| {}).expect("group"), 0);
    assert!(e.extract(T, 0).expect("extract").len() == 1);

    // Rules see it as absent: "must exist" refuses, "must not exist" passes.
    let must_exist = RejectRules {
        doesnt_exist: true,
        ..none()
    };
    assert_eq!(
        e.write(T, b"soon", b"x", &must_exist),
        Err(EngineError::ObjectDoesntExist)
    );
    assert_eq!(e.remove(T, b"soon", &none()), Ok(0));
    let must_not_exist = RejectRules {
        exists: true,
        ..none()
    };
    let v = e
        .write(T, b"soon", b"new", &must_not_exist)
        .expect("absent");
    let o = e.read(T, b"soon").expect("written again");
    assert_eq!((o.value, o.version, o.expires_at_ms), (&b"new"[..], v, 0));
    e.check_invariants();
}

#[test]
fn increments_keep_the_deadline_and_writes_clear_it() {
    let mut e = engine();
    e.write_expiring(T, b"n", &5i64.to_le_bytes(), NOW + 100, &none())
        .expect("write");
    let (n, _) = e.increment_i64(T, b"n", 2, &none()).expect("incr");
    assert_eq!(n, 7);
    assert_eq!(e.read(T, b"n").expect("live").expires_at_ms, NOW + 100);
    e.write(T, b"n", &1i64.to_le_bytes(), &none())
        .expect("write");
    assert_eq!(e.read(T, b"n").expect("live").expires_at_ms, 0);
    // An expired counter counts as absent: 0 + 3, without a deadline.
    e.write_expiring(T, b"m", &9i64.to_le_bytes(), NOW + 1, &none())
        .expect("write");
    e.set_clock_ms(Some(NOW + 1));
    assert_eq!(e.increment_i64(T, b"m", 3, &none()).expect("incr").0, 3);
    assert_eq!(e.read(T, b"m").expect("live").expires_at_ms, 0);
    e.check_invariants();
}

#[test]
fn the_sweep_names_due_objects_and_expire_removes_them() {
    let mut e = engine();
    for i in 0..200u32 {
        let key = format!("k{i:03}");
        // Every third expires at NOW + 50, every third at NOW + 500, the rest never.
        let deadline = match i % 3 {
            0 => NOW + 50,
            1 => NOW + 500,
            _ => 0,
        };
        e.write_expiring(T, key.as_bytes(), &[7; 40], deadline, &none())
            .expect("write");
    }
    assert_eq!(e.expiring_objects(T, 0).expect("count"), 134);
    let sum = |n: u64, at: u64| u128::from(n) * u128::from(at);
    assert_eq!(
        e.expiring_figures(T, 0).expect("figures").deadline_sum_ms,
        sum(67, NOW + 50) + sum(67, NOW + 500)
    );
    // Nothing due: every segment is skipped by its bound, none is read.
    let sweep = e.sweep_expired(1000, u64::MAX);
    assert!(sweep.expired.is_empty());
    assert_eq!(sweep.bytes_read, 0);

    e.set_clock_ms(Some(NOW + 50));
    let mut due = Vec::new();
    // Small steps: the cursor resumes inside segments and across them.
    for _ in 0..10_000 {
        let sweep = e.sweep_expired(7, 300);
        due.extend(sweep.expired);
        if sweep.wrapped && due.len() >= 67 {
            break;
        }
    }
    due.sort_by(|a, b| a.key.cmp(&b.key));
    due.dedup();
    assert_eq!(due.len(), 67, "every third of 200, each once");
    // A key rewritten after it was found is not removed by its stale name.
    let stale = due.pop().expect("one");
    e.write(T, &stale.key, b"fresh", &none()).expect("rewrite");
    assert_eq!(e.expire(T, &stale.key, stale.version), Ok(false));
    for d in &due {
        assert_eq!(e.expire(T, &d.key, d.version), Ok(true));
        assert_eq!(e.expire(T, &d.key, d.version), Ok(false), "only once");
    }
    assert_eq!(e.read(T, &stale.key).expect("kept").value, b"fresh");
    assert_eq!(
        e.expiring_figures(T, 0),
        Ok(crate::ExpiringFigures {
            objects: 67,
            deadline_sum_ms: sum(67, NOW + 500),
        }),
        "the removed and the rewritten left the count and the sum"
    );
    // The next due objects are not due yet: nothing found. The first sweep
    // reads the segments whose bound was early to recount it exactly; from
    // then on none is read.
    let sweep = e.sweep_expired(1000, u64::MAX);
    assert!(sweep.expired.is_empty());
    let sweep = e.sweep_expired(1000, u64::MAX);
    assert!(sweep.expired.is_empty());
    assert_eq!(sweep.bytes_read, 0);
    // A key not yet expired is not removed by `expire`.
    let later = b"k001";
    let v = e.read(T, later).expect("live").version;
    assert_eq!(e.expire(T, later, v), Ok(false));
    e.check_invariants();
}

#[test]
fn cleaning_splitting_and_replay_keep_deadlines() {
    let mut e = engine();
    for round in 0..6u32 {
        for i in 0..60u32 {
            let key = format!("key{i:02}");
            let deadline = if i % 2 == 0 {
                NOW + 1000 + u64::from(i)
            } else {
                0
            };
            e.write_expiring(T, key.as_bytes(), &[round as u8; 60], deadline, &none())
                .expect("write");
        }
    }
    let before = e.cleaner_totals().entries_moved;
    e.clean();
    assert!(
        e.cleaner_totals().entries_moved > before,
        "the cleaner moved live objects"
    );
    e.check_invariants();
    let deadline_of = |e: &Engine, i: u32| {
        e.read(T, format!("key{i:02}").as_bytes())
            .map(|o| o.expires_at_ms)
    };
    for i in 0..60 {
        let want = if i % 2 == 0 {
            NOW + 1000 + u64::from(i)
        } else {
            0
        };
        assert_eq!(deadline_of(&e, i), Ok(want), "key{i:02} after cleaning");
    }

    // Replay of the tablet's segments into another engine.
    let segments: Vec<Vec<u8>> = e
        .segments(T, 0)
        .expect("segments")
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    let mut r = Engine::with_max_key_bytes(e.config().clone(), 64).expect("config");
    r.set_clock_ms(Some(NOW));
    r.replay(T, HashRange::FULL, segments.iter().map(Vec::as_slice))
        .expect("replay");
    r.check_invariants();
    for i in 0..60 {
        assert_eq!(deadline_of(&r, i), deadline_of(&e, i), "key{i:02} replayed");
    }
    assert_eq!(r.expiring_objects(T, 0), Ok(30));
    let even_sum: u128 = (0..60u64)
        .step_by(2)
        .map(|i| u128::from(NOW + 1000 + i))
        .sum();
    let figures = |e: &Engine, start| e.expiring_figures(T, start).expect("figures");
    assert_eq!(figures(&e, 0).deadline_sum_ms, even_sum, "after cleaning");
    assert_eq!(figures(&r, 0).deadline_sum_ms, even_sum, "after replay");

    // A split keeps each moved object's deadline.
    let mid = u64::MAX / 2;
    e.split_tablet(T, mid + 1).expect("split");
    e.check_invariants();
    for i in 0..60 {
        let want = if i % 2 == 0 {
            NOW + 1000 + u64::from(i)
        } else {
            0
        };
        assert_eq!(deadline_of(&e, i), Ok(want), "key{i:02} after the split");
    }
    assert_eq!(
        e.expiring_objects(T, 0).expect("low") + e.expiring_objects(T, mid + 1).expect("high"),
        30
    );
    assert_eq!(
        figures(&e, 0).deadline_sum_ms + figures(&e, mid + 1).deadline_sum_ms,
        even_sum,
        "after the split"
    );
    // After the deadlines all even keys are gone from both halves.
    e.set_clock_ms(Some(NOW + 2000));
    for i in 0..60 {
        let r = deadline_of(&e, i);
        if i % 2 == 0 {
            assert_eq!(r, Err(EngineError::ObjectDoesntExist));
        } else {
            assert_eq!(r, Ok(0));
        }
    }
}

#[test]
fn install_carries_a_deadline_and_never_lowers_a_version_under_an_expired_one() {
    let mut e = engine();
    e.install_expiring(T, b"a", b"moved", 40, NOW + 5)
        .expect("install");
    assert_eq!(e.read(T, b"a").expect("live").expires_at_ms, NOW + 5);
    e.set_clock_ms(Some(NOW + 5));
    // The held entry (version 40) is expired, but an older version must
    // still not replace it: versions only grow for a key.
    e.install(T, b"a", b"older", 30).expect("ignored");
    assert_eq!(e.read(T, b"a"), Err(EngineError::ObjectDoesntExist));
    e.install(T, b"a", b"newer", 41).expect("install");
    assert_eq!(e.read(T, b"a").expect("live").value, b"newer");
    e.check_invariants();
}

#[test]
fn modify_writes_f_of_the_live_value_and_keeps_its_deadline() {
    let mut e = engine();
    let append = |v: Option<&[u8]>| -> Result<Vec<u8>, &'static str> {
        let mut out = v.unwrap_or_default().to_vec();
        out.push(b'x');
        Ok(out)
    };
    let (v, first) = e.modify(T, b"k", append).expect("modify").expect("f");
    assert_eq!(v, b"x");
    e.write_expiring(T, b"k", b"ab", NOW + 10, &none())
        .expect("write");
    let (v, version) = e.modify(T, b"k", append).expect("modify").expect("f");
    assert!(version > first);
    let o = e.read(T, b"k").expect("live");
    assert_eq!(
        (o.value, o.version, o.expires_at_ms),
        (&b"abx"[..], version, NOW + 10)
    );
    assert_eq!(v, b"abx");
    // f's refusal writes nothing.
    let refused = e.modify(T, b"k", |_| Err("not a number")).expect("modify");
    assert_eq!(refused, Err("not a number"));
    assert_eq!(e.read(T, b"k").expect("live").version, version);
    // Too large for the engine: its error, nothing written.
    let big = e.modify(T, b"k", |_| Ok::<_, ()>(vec![0; 513]));
    assert!(matches!(big, Err(EngineError::ValueTooLarge { .. })));
    // Expired: f sees nothing, and the result has no deadline.
    e.set_clock_ms(Some(NOW + 10));
    let (v, _) = e.modify(T, b"k", append).expect("modify").expect("f");
    assert_eq!(v, b"x");
    assert_eq!(e.read(T, b"k").expect("live").expires_at_ms, 0);
    e.check_invariants();
}

#[test]
fn a_pinned_clock_decides_expiry_until_its_guard_drops() {
    let mut e = engine();
    e.write_expiring(T, b"soon", b"1", NOW + 10, &none())
        .expect("write");
    e.set_clock_ms(Some(NOW + 20)); // expired on the engine's clock
    assert_eq!(e.read(T, b"soon"), Err(EngineError::ObjectDoesntExist));
    let o = e.read_expired_too(T, b"soon").expect("still in the log");
    assert_eq!((o.value, o.expires_at_ms), (&b"1"[..], NOW + 10));
    {
        let _then = e.pin_clock(NOW + 9);
        assert!(e.read(T, b"soon").is_ok(), "before its deadline at the pin");
        assert_eq!(keys_by_log(&e), vec![b"soon".to_vec()]);
        {
            let _inner = e.pin_clock(NOW + 10);
            assert!(e.read(T, b"soon").is_err(), "the inner pin decides");
        }
        assert!(e.read(T, b"soon").is_ok(), "the outer pin is back");
    }
    assert_eq!(e.now_ms(), NOW + 20, "unpinned: the engine's clock again");
    assert_eq!(e.read(T, b"soon"), Err(EngineError::ObjectDoesntExist));
    assert_eq!(
        e.read_expired_too(T, b"never"),
        Err(EngineError::ObjectDoesntExist)
    );
}
