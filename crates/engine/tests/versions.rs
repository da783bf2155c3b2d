//! The version counter refuses instead of saturating at `MAX_VERSION`.

mod shared;

use shared::{engine_of, segment_copies};

use insitu_engine::{Engine, EngineError, HashRange, MAX_VERSION, RejectRules};

const T: u64 = 3;

fn engine() -> Engine {
    engine_of(4096, 16 * 4096, 512, &[T])
}

#[test]
fn writes_refuse_once_the_last_version_is_issued() {
    let mut e = engine();
    let any = RejectRules::default();
    e.write(T, b"a", b"1", &any).expect("write");
    e.raise_version(T, 0, MAX_VERSION)
        .expect("raise to the last version");
    let token = e.scan_token(T, 0).expect("token");
    assert_eq!(e.write(T, b"b", b"2", &any), Ok(MAX_VERSION));
    assert_ne!(e.scan_token(T, 0).expect("token"), token);
    let exhausted = Err(EngineError::VersionExhausted {
        version: MAX_VERSION + 1,
    });
    // Every versioned mutation refuses; nothing changed, nothing allocated.
    let before = e.memory();
    let token = e.scan_token(T, 0).expect("token");
    assert_eq!(e.write(T, b"c", b"3", &any), exhausted);
    assert_eq!(e.write(T, b"b", b"again", &any), exhausted);
    assert_eq!(e.remove(T, b"a", &any), exhausted.clone().map(|_: u64| 0));
    assert_eq!(
        e.increment_i64(T, b"n", 1, &any).map(|_| ()),
        exhausted.clone().map(|_: u64| ())
    );
    assert_eq!(e.memory(), before);
    assert_eq!(e.scan_token(T, 0).expect("token"), token);
    assert_eq!(e.read(T, b"b").expect("b").version, MAX_VERSION);
    assert_eq!(e.read(T, b"b").expect("b").value, b"2");
    assert!(e.read(T, b"a").is_ok(), "the refused remove left it");
    e.check_invariants();
}

#[test]
fn migration_paths_refuse_versions_beyond_the_maximum() {
    let mut e = engine();
    assert_eq!(
        e.install(T, b"k", b"v", u64::MAX),
        Err(EngineError::VersionExhausted { version: u64::MAX })
    );
    assert!(e.read(T, b"k").is_err(), "nothing installed");
    assert_eq!(
        e.raise_version(T, 0, MAX_VERSION + 1),
        Err(EngineError::VersionExhausted {
            version: MAX_VERSION + 1
        })
    );
    assert_eq!(e.tablet_stats(T, 0).expect("stats").next_version, 1);
    // The last version itself installs; the counter then sits one past it.
    e.install(T, b"k", b"v", MAX_VERSION)
        .expect("install the last version");
    assert_eq!(
        e.tablet_stats(T, 0).expect("stats").next_version,
        MAX_VERSION + 1
    );
    assert!(matches!(
        e.write(T, b"x", b"y", &RejectRules::default()),
        Err(EngineError::VersionExhausted { .. })
    ));
    e.check_invariants();
}

#[test]
fn replay_refuses_versions_beyond_the_maximum_and_keeps_an_exhausted_counter() {
    let mut e = engine();
    e.write(T, b"a", b"1", &RejectRules::default())
        .expect("write");
    e.raise_version(T, 0, MAX_VERSION).expect("raise");
    e.write(T, b"b", b"2", &RejectRules::default())
        .expect("last");
    let segs = segment_copies(&e, T, 0);
    let mut r = engine();
    r.drop_tablet(T, 0);
    let report = r
        .replay(T, HashRange::FULL, segs.iter().map(Vec::as_slice))
        .expect("replay");
    assert!(report.corrupt.is_empty());
    assert_eq!(report.objects_loaded, 2);
    assert!(matches!(
        r.write(T, b"c", b"3", &RejectRules::default()),
        Err(EngineError::VersionExhausted { .. })
    ));
}
