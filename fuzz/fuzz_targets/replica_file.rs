//! Any bytes as a replica file (a backup's disk after a crash, a torn write
//! or a flipped bit): `replica_file::parse` must never panic or trust a
//! length it was not given, and what it returns must be self-consistent.
//! The input is tried as is and behind a valid header (random bytes rarely
//! carry the header's magic and crc), so the record reader sees it.
#![no_main]

use insitu_backup::replica_file::{self, HEADER_BYTES, MAX_DIGEST_SEGMENTS};
use insitu_backup::{ReplicaId, Tablet};
use libfuzzer_sys::fuzz_target;

fn check(file: &[u8]) {
    let Ok(p) = replica_file::parse(file) else {
        return;
    };
    let len = file.len() as u64;
    assert!(p.valid_file_bytes >= HEADER_BYTES as u64 && p.valid_file_bytes <= len);
    assert!(p.data.len() as u64 <= len - HEADER_BYTES as u64);
    assert_eq!(p.cut.is_none(), p.valid_file_bytes == len);
    if let Some(d) = &p.digest {
        assert!(d.segments.len() <= MAX_DIGEST_SEGMENTS);
        assert!(d.segments.windows(2).all(|w| w[0] < w[1]));
    }
    // What was kept parses again to the same thing, uncut.
    let again = replica_file::parse(&file[..p.valid_file_bytes as usize]).expect("valid prefix");
    assert_eq!((again.data, again.digest, again.cut), (p.data, p.digest, None));
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let id = ReplicaId {
        master: 1,
        log: 2,
        segment: 3,
    };
    let tablet = Tablet {
        table: 4,
        start_hash: 5,
    };
    let mut file = replica_file::encode_header(9, id, tablet).to_vec();
    file.extend_from_slice(data);
    check(&file);
});
