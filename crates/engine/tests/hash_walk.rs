//! Hash-order walks: chunked extraction for migration, sorted hash lists.

mod shared;

use shared::engine_of;

use std::collections::HashMap;

use insitu_engine::{Engine, EngineError, HashRange, RejectRules, key_hash};

const T: u64 = 6;
const OTHER: u64 = 7;

fn engine() -> Engine {
    engine_of(64 * 1024, 256 * 64 * 1024, 4096, &[T, OTHER])
}

fn put(e: &mut Engine, table: u64, i: u64, len: usize, fill: u8) {
    e.write(
        table,
        &i.to_le_bytes(),
        &vec![fill; len],
        &RejectRules::default(),
    )
    .expect("write");
}

type Objects = HashMap<Vec<u8>, (Vec<u8>, u64)>;

fn extract_all(e: &Engine) -> Objects {
    e.extract(T, 0)
        .expect("extract")
        .into_iter()
        .map(|(k, v, ver, _)| (k, (v, ver)))
        .collect()
}

#[test]
fn chunked_extraction_returns_each_object_once_across_cleaning() {
    let mut e = engine();
    for i in 0..3_000u64 {
        put(&mut e, T, i, 100 + (i % 300) as usize, 1);
        put(&mut e, OTHER, i, 200, 1);
    }
    for i in 0..1_500u64 {
        put(&mut e, T, i, 50, 2); // leave dead entries behind for the cleaner
    }
    let want = extract_all(&e);
    let mut cursor = e.extract_begin(T, 0).expect("begin");
    let mut got: Objects = HashMap::new();
    let mut last_hash = None;
    let mut chunks = 0;
    while !cursor.is_done() {
        let chunk = e.extract_chunk(&mut cursor, 16 * 1024).expect("chunk");
        assert!(!chunk.objects.is_empty());
        let bytes: usize = chunk
            .objects
            .iter()
            .map(|(k, v, _, _)| k.len() + v.len())
            .sum();
        assert!(bytes <= 16 * 1024, "a chunk of {bytes} bytes");
        assert!(e.memory().transient_bytes >= chunk.charge.bytes());
        for (k, v, ver, _) in chunk.objects {
            let h = key_hash(T, &k);
            assert!(last_hash.is_none_or(|l| l < h), "hash order");
            last_hash = Some(h);
            assert!(got.insert(k, (v, ver)).is_none(), "returned twice");
        }
        chunks += 1;
        // Churn elsewhere and clean between chunks: log positions move.
        for i in 0..200u64 {
            put(&mut e, OTHER, i, 200, chunks as u8);
        }
        e.clean();
    }
    assert!(chunks > 10);
    assert_eq!(got, want);
    assert!(
        e.extract_chunk(&mut cursor, 1024)
            .expect("done")
            .objects
            .is_empty()
    );
    drop(cursor);
    assert_eq!(e.memory().transient_bytes, 0, "all charges released");
    e.check_invariants();
}

#[test]
fn extraction_with_writes_in_between_follows_the_documented_rule() {
    let mut e = engine();
    for i in 0..1_000u64 {
        put(&mut e, T, i, 64, 1);
    }
    let mut cursor = e.extract_begin(T, 0).expect("begin");
    let first = e.extract_chunk(&mut cursor, 8 * 1024).expect("chunk");
    let seen: Vec<Vec<u8>> = first.objects.iter().map(|o| o.0.clone()).collect();
    let next = cursor.next_hash().expect("more to come");
    // Ahead of the cursor: one removed, one overwritten; one new key.
    let ahead: Vec<u64> = (0..1_000u64)
        .filter(|i| key_hash(T, &i.to_le_bytes()) > next)
        .take(2)
        .collect();
    e.remove(T, &ahead[0].to_le_bytes(), &RejectRules::default())
        .expect("remove");
    put(&mut e, T, ahead[1], 64, 9);
    let mut rest: Objects = HashMap::new();
    while !cursor.is_done() {
        for (k, v, ver, _) in e
            .extract_chunk(&mut cursor, 8 * 1024)
            .expect("chunk")
            .objects
        {
            rest.insert(k, (v, ver));
        }
    }
    assert!(
        !rest.contains_key(ahead[0].to_le_bytes().as_slice()),
        "removed: skipped"
    );
    assert_eq!(
        rest[&ahead[1].to_le_bytes().to_vec()].0,
        vec![9u8; 64],
        "newest value"
    );
    assert_eq!(seen.len() + rest.len(), 999);
    // A re-created tablet is refused, not walked.
    e.drop_tablet(T, 0);
    assert_eq!(
        e.extract_chunk(&mut cursor, 1024).err(),
        Some(EngineError::UnknownTablet)
    );
    e.create_tablet(T, HashRange::FULL).expect("tablet");
    assert!(matches!(
        e.extract_chunk(&mut cursor, 1024),
        Err(EngineError::BadTablet(_))
    ));
}

#[test]
fn sorted_hashes_are_charged_and_walks_cost_one_probe_per_hash() {
    let mut e = engine();
    for i in 0..2_000u64 {
        put(&mut e, T, i, 10, 1);
    }
    let from = u64::MAX / 2;
    let mut list = e.sorted_hashes(T, 0, from).expect("list");
    let cursors = list.hashes();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]));
    assert!(cursors.iter().all(|&h| h >= from));
    let expected = (0..2_000u64)
        .filter(|i| key_hash(T, &i.to_le_bytes()) >= from)
        .count();
    // 2,000 keys over 2^28 index prefixes: one key per group here.
    assert_eq!(cursors.len(), expected);
    assert_eq!(e.memory().transient_bytes, list.bytes());
    let before = e.hash_scan_work();
    let mut n = 0;
    for w in cursors[..101].windows(2) {
        n += e
            .objects_in_hash_group(T, 0, w[0], |o| {
                let h = key_hash(T, o.key);
                assert!(
                    w[0] <= h && h < w[1],
                    "a group's keys lie below the next cursor"
                );
            })
            .expect("probe");
    }
    assert_eq!(n, 100);
    assert_eq!(e.hash_scan_work().index_probes - before.index_probes, 100);
    assert!(e.sorted_hashes_current(&list));
    drop(list);
    assert_eq!(e.memory().transient_bytes, 0);
}

/// The index keeps 28 bits of a key's hash (for a tablet of the whole
/// range, its top 28): keys sharing them form one group of a walk.
fn prefix(hash: u64) -> u64 {
    hash >> 36
}

#[test]
fn keys_of_one_index_prefix_travel_together_and_a_cursor_inside_a_group_is_honoured() {
    let mut e = engine();
    let n = 100_000u64;
    let mut by_prefix: HashMap<u64, Vec<u64>> = HashMap::new();
    for i in 0..n {
        put(&mut e, T, i, 4, 1);
        by_prefix
            .entry(prefix(key_hash(T, &i.to_le_bytes())))
            .or_default()
            .push(key_hash(T, &i.to_le_bytes()));
    }
    // ~18 pairs expected among 100,000 keys; the key set is fixed, so is this.
    let mut shared: Vec<Vec<u64>> = by_prefix.into_values().filter(|v| v.len() > 1).collect();
    assert!(!shared.is_empty(), "no two keys share an index prefix");
    shared.sort();
    // The whole walk: every key once, in hash order, groups whole.
    let mut list = e.sorted_hashes(T, 0, 0).expect("list");
    let cursors = list.hashes();
    assert_eq!(
        cursors.len() as u64,
        n - shared.iter().map(|g| g.len() as u64 - 1).sum::<u64>()
    );
    let mut seen = Vec::new();
    for &c in &cursors {
        let before = seen.len();
        e.objects_in_hash_group(T, 0, c, |o| seen.push(key_hash(T, o.key)))
            .expect("group");
        let group = &seen[before..];
        assert!(!group.is_empty());
        assert!(group.iter().all(|&h| prefix(h) == prefix(group[0])));
    }
    assert_eq!(seen.len() as u64, n);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "hash order, each once"
    );
    // A cursor between two keys of one group: the lower key is behind it.
    let mut group = shared[0].clone();
    group.sort();
    let (low, high) = (group[0], group[1]);
    let mut tail = e.sorted_hashes(T, 0, high).expect("list");
    let first = tail.next_from(0).expect("a group").1;
    assert_eq!(first, high, "the first cursor is the list's own");
    let mut got = Vec::new();
    e.objects_in_hash_group(T, 0, first, |o| got.push(key_hash(T, o.key)))
        .expect("group");
    assert!(got.contains(&high) && !got.contains(&low));
    // An exact lookup finds the lower key alone.
    let mut exact = Vec::new();
    e.objects_with_hash(T, 0, low, |o| exact.push(key_hash(T, o.key)))
        .expect("exact");
    assert_eq!(exact, vec![low]);
    e.check_invariants();
}
