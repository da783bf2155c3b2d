//! Sequence limits are checked while decoding, before the vector is built:
//! a 4 MiB frame of tiny items is refused without expanding to ~100 MB.
//! A counting global allocator measures the peak heap growth of a decode.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use insitu_protocol::plan::{Op, PredOp, ScanPlan};
use insitu_protocol::{
    BackupOp, MAX_BACKUP_OPS, MAX_BODY_BYTES, MAX_DIGEST_SEGMENTS, MAX_MULTI_ITEMS, Request, blob,
    decode_request,
};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Tests of this binary run one at a time, so the heap counters see only
/// the decode being measured.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Bytes the heap grew by at most while `f` ran.
fn peak_growth<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A body of `prefix`, then a sequence of `count` copies of `item`, then
/// `suffix`: about 4 MiB in all.
fn crafted(prefix: &[u8], item: &[u8], suffix: &[u8]) -> (Vec<u8>, usize) {
    let count = (MAX_BODY_BYTES - prefix.len() - suffix.len() - 8) / item.len();
    let mut body = prefix.to_vec();
    varint(count, &mut body);
    for _ in 0..count {
        body.extend_from_slice(item);
    }
    body.extend_from_slice(suffix);
    assert!(body.len() <= MAX_BODY_BYTES);
    (body, count)
}

/// The bytes before and after the sequence, found by encoding it with 0 and 1 items.
fn split_around<'a>(zero: &'a [u8], one: &'a [u8], item_len: usize) -> (&'a [u8], &'a [u8]) {
    let at = zero.iter().zip(one).take_while(|(a, b)| a == b).count();
    assert_eq!(zero[at], 0, "the length varint of the empty sequence");
    (&zero[..at], &one[at + 1 + item_len..])
}

#[test]
fn a_frame_of_millions_of_empty_keys_is_refused_before_it_is_built() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let enc = |n: usize| {
        postcard::to_stdvec(&Request::MultiRead {
            table: 1,
            keys: vec![blob(b""); n],
        })
        .unwrap()
    };
    let (zero, one) = (enc(0), enc(1));
    let (prefix, suffix) = split_around(&zero, &one, 1);
    let (body, count) = crafted(prefix, &[0], suffix);
    assert!(count > 4_000_000);
    let (result, grew) = peak_growth(|| decode_request(&body).map(|_| ()));
    let e = result.unwrap_err().to_string();
    assert!(
        e.contains(&count.to_string()) && e.contains(&format!("limit of {MAX_MULTI_ITEMS}")),
        "{e}"
    );
    // Unbounded, the vector of slices alone would be 16 bytes x 4M = 64 MiB.
    assert!(grew < 1 << 20, "decoding grew the heap by {grew} bytes");
}

#[test]
fn a_frame_of_millions_of_predicate_ops_is_refused_before_it_is_built() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let enc = |n: usize| {
        postcard::to_stdvec(&Request::Scan {
            table: 1,
            start_hash: 0,
            end_hash: 0,
            map_version: 1,
            plan: ScanPlan {
                filter: vec![PredOp::And; n],
                ..ScanPlan::new(Op::Count)
            },
            op_id: 0,
            budget_ms: 0,
            snapshot_ts: 0,
        })
        .unwrap()
    };
    let (zero, one) = (enc(0), enc(1));
    let and = postcard::to_stdvec(&PredOp::And).unwrap();
    let (prefix, suffix) = split_around(&zero, &one, and.len());
    let (body, count) = crafted(prefix, &and, suffix);
    let (result, grew) = peak_growth(|| decode_request(&body).map(|_| ()));
    let e = result.unwrap_err().to_string();
    assert!(
        e.contains("predicate operations") && e.contains(&count.to_string()),
        "{e}"
    );
    assert!(grew < 1 << 20, "decoding grew the heap by {grew} bytes");
}

#[test]
fn an_over_long_json_path_is_refused_before_it_is_copied() {
    use insitu_protocol::json_path::{JsonLit, JsonPath, JsonStep, MAX_JSON_PATH_BYTES};
    use insitu_protocol::plan::CmpOp;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let scan = |key: String, lit: String| Request::Scan {
        table: 1,
        start_hash: 0,
        end_hash: 0,
        map_version: 1,
        plan: ScanPlan {
            filter: vec![PredOp::JsonCmp {
                path: JsonPath {
                    steps: vec![JsonStep::Key(key)],
                },
                op: CmpOp::Eq,
                value: JsonLit::Str(lit),
            }],
            ..ScanPlan::new(Op::Count)
        },
        op_id: 0,
        budget_ms: 0,
        snapshot_ts: 0,
    };
    // A key of ~4 MiB in a frame: refused by its length, never copied.
    let body = postcard::to_stdvec(&scan("k".repeat(MAX_BODY_BYTES - 100), String::new())).unwrap();
    let (result, grew) = peak_growth(|| decode_request(&body).map(|_| ()));
    let e = result.unwrap_err().to_string();
    assert!(
        e.contains("JSON path key") && e.contains(&format!("limit of {MAX_JSON_PATH_BYTES}")),
        "{e}"
    );
    assert!(grew < 64 << 10, "decoding grew the heap by {grew} bytes");
    // So is a ~4 MiB string to compare with.
    let body = postcard::to_stdvec(&scan("k".into(), "s".repeat(MAX_BODY_BYTES - 100))).unwrap();
    let (result, grew) = peak_growth(|| decode_request(&body).map(|_| ()));
    let e = result.unwrap_err().to_string();
    assert!(e.contains("JSON string literal"), "{e}");
    assert!(grew < 64 << 10, "decoding grew the heap by {grew} bytes");
    // Within the limits, the plan decodes as sent.
    let ok = scan("k".repeat(MAX_JSON_PATH_BYTES), "bob".into());
    let body = postcard::to_stdvec(&ok).unwrap();
    assert_eq!(decode_request(&body).unwrap(), ok);
}

#[test]
fn a_replication_frame_of_millions_of_tiny_ops_is_refused_before_it_is_built() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let free = BackupOp::Free { log: 0, segment: 0 };
    let enc = |n: usize| {
        postcard::to_stdvec(&Request::BackupWrite {
            cluster: 1,
            master: 1,
            ops: vec![free.clone(); n],
        })
        .unwrap()
    };
    let (zero, one) = (enc(0), enc(1));
    let item = postcard::to_stdvec(&free).unwrap();
    let (prefix, suffix) = split_around(&zero, &one, item.len());
    let (body, count) = crafted(prefix, &item, suffix);
    assert!(count > 1_000_000, "{count}");
    let (result, grew) = peak_growth(|| decode_request(&body).map(|_| ()));
    let e = result.unwrap_err().to_string();
    assert!(
        e.contains("backup operations") && e.contains(&format!("limit of {MAX_BACKUP_OPS}")),
        "{e}"
    );
    // Unbounded, ~1.4M ops of ~64 bytes each would be ~90 MB.
    assert!(grew < 8 << 20, "decoding grew the heap by {grew} bytes");
}

#[test]
fn a_digest_over_its_segment_limit_is_refused_and_one_at_it_decodes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let write = |n: usize| Request::BackupWrite {
        cluster: 1,
        master: 1,
        ops: vec![BackupOp::Digest {
            log: 1,
            segment: 1,
            seq: 1,
            segments: (0..n as u64).collect(),
        }],
    };
    let at = write(MAX_DIGEST_SEGMENTS);
    let bytes = postcard::to_stdvec(&at).unwrap();
    assert_eq!(decode_request(&bytes).unwrap(), at);
    let bytes = postcard::to_stdvec(&write(MAX_DIGEST_SEGMENTS + 1)).unwrap();
    let e = decode_request(&bytes).unwrap_err().to_string();
    assert!(e.contains("digest segments"), "{e}");
}

#[test]
fn sequences_within_the_limits_still_decode() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let keys = vec![blob(b"k"); MAX_MULTI_ITEMS];
    let req = Request::MultiRead { table: 1, keys };
    let bytes = postcard::to_stdvec(&req).unwrap();
    assert_eq!(decode_request(&bytes).unwrap(), req);
    let over = Request::MultiRemove {
        table: 1,
        keys: vec![blob(b"k"); MAX_MULTI_ITEMS + 1],
    };
    let bytes = postcard::to_stdvec(&over).unwrap();
    assert!(decode_request(&bytes).is_err());
    let over = Request::SnapshotRead {
        table: 1,
        snapshot_ts: 5,
        keys: vec![blob(b"k"); MAX_MULTI_ITEMS + 1],
    };
    let bytes = postcard::to_stdvec(&over).unwrap();
    assert!(decode_request(&bytes).is_err());
    // A refusal is not remembered into the next, good, decode.
    let ok = postcard::to_stdvec(&Request::Ping).unwrap();
    assert_eq!(decode_request(&ok).unwrap(), Request::Ping);
}

#[test]
fn transaction_items_and_participants_are_bounded_while_decoding() {
    use insitu_protocol::txn::{MAX_TXN_ITEMS, MAX_TXN_PARTICIPANTS, TxnItem, TxnWrite};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let item = TxnItem {
        table: 1,
        key: blob(b"k"),
        read_version: None,
        write: TxnWrite::Remove,
    };
    let prepare = |items: usize, others: usize| {
        postcard::to_stdvec(&Request::TxnPrepare {
            txn: 1,
            primary: None,
            others: vec![
                insitu_protocol::txn::TxnAnchor {
                    table: 1,
                    key: blob(b"h")
                };
                others
            ],
            items: vec![item.clone(); items],
            writes: true,
        })
        .unwrap()
    };
    assert!(decode_request(&prepare(MAX_TXN_ITEMS, MAX_TXN_PARTICIPANTS)).is_ok());
    let e = decode_request(&prepare(MAX_TXN_ITEMS + 1, 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("limit of {MAX_TXN_ITEMS}")), "{e}");
    let e = decode_request(&prepare(1, MAX_TXN_PARTICIPANTS + 1))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("limit of {MAX_TXN_PARTICIPANTS}")),
        "{e}"
    );
}
