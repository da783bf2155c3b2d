//! Tests of the log entry format (`entry.rs`).

use super::*;

fn one_at(kind: u8, version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(max_entry_bytes(key.len(), value.len()));
    let len = append(&mut buf, kind, 7, version, key, value);
    assert_eq!(len, buf.len());
    buf
}

fn one(kind: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    one_at(kind, 42, key, value)
}

#[test]
fn layout_is_as_documented() {
    let buf = one_at(KIND_OBJECT, 300, b"key", b"value");
    // crc 4, flags 1, version 300 = 2 bytes, key_len 1, value_len 1.
    assert_eq!(buf.len(), 4 + 1 + 2 + 1 + 1 + 3 + 5);
    assert_eq!(buf[4], KIND_OBJECT | 1 << 2);
    assert_eq!(&buf[5..7], &300u16.to_le_bytes());
    assert_eq!(buf[7], 3);
    assert_eq!(buf[8], 5);
    assert_eq!(&buf[9..12], b"key");
    assert_eq!(&buf[12..17], b"value");
    let mut crc = crc32c::crc32c(&7u64.to_le_bytes());
    crc = crc32c::crc32c_append(crc, &buf[4..]);
    assert_eq!(&buf[0..4], &crc.to_le_bytes());
    let o = object_at(&buf, 0);
    assert_eq!(
        (o.key, o.value, o.version),
        (&b"key"[..], &b"value"[..], 300)
    );
    assert_eq!(key_at(&buf, 0), b"key");
    assert_eq!(len_at(&buf, 0), buf.len());
    // The benchmark's object: a 30-byte key, a 100-byte value.
    assert_eq!(header_bytes(30, 100, (1 << 24) - 1), 10);
}

#[test]
fn varints_round_trip_at_every_width_and_sizes_agree() {
    let mut cases = vec![0u64, 1, 127, 128, 16_383, 16_384, u64::MAX, u64::MAX - 1];
    cases.extend((0..64).map(|b| 1u64 << b));
    cases.extend((1..64).map(|b| (1u64 << b) - 1));
    for v in cases {
        let mut out = [0u8; 10];
        let mut n = 0;
        put_varint(&mut out, &mut n, v);
        assert_eq!(n, varint_bytes(v), "{v}");
        let mut at = 0;
        assert_eq!(get_varint(&out, &mut at), v);
        assert_eq!(at, n);
        let mut at = 0;
        assert_eq!(get_varint_checked(&out[..n], &mut at, 10), Some(v));
        assert_eq!(at, n);
        // One byte short is refused, never read past.
        let mut at = 0;
        assert_eq!(get_varint_checked(&out[..n - 1], &mut at, 10), None);
    }
    for v in [0u64, 1, 255, 256, 1 << 24, u64::MAX] {
        let width = version_bytes(v);
        let mut buf = v.to_le_bytes()[..width].to_vec();
        assert_eq!(get_le(&buf, 0, width), v, "cut buffer");
        buf.extend_from_slice(&[0xAB; 8]);
        assert_eq!(get_le(&buf, 0, width), v, "masked load");
    }
    for (key_len, value_len, version) in [
        (0, 0, 1),
        (65_536, 0, 5),
        (1, u32::MAX as usize, u64::MAX - 1),
    ] {
        let h = header_bytes(key_len, value_len, version);
        assert!(h <= MAX_HEADER_BYTES);
    }
}

#[test]
fn untrusted_varints_refuse_overlong_and_overflowing_forms() {
    let mut at = 0;
    assert_eq!(
        get_varint_checked(&[0x81, 0x00], &mut at, 10),
        None,
        "not shortest"
    );
    assert_eq!(
        get_varint_checked(&[0x80, 0x80, 0x01], &mut at, 2),
        None,
        "too long"
    );
    let eleven = [0xffu8; 9]
        .iter()
        .copied()
        .chain([0x02])
        .collect::<Vec<_>>();
    assert_eq!(
        get_varint_checked(&eleven, &mut at, 10),
        None,
        "beyond 64 bits"
    );
    assert_eq!(at, 0, "a refused varint moves nothing");
}

#[test]
fn the_fast_header_path_agrees_with_the_general_one() {
    for version in [1u64, 255, 256, 1 << 24, 1 << 32, 1 << 40, u64::MAX - 1] {
        for key_len in [0usize, 1, 127, 128, 300] {
            for value_len in [0usize, 8, 127, 128, 16_383, 16_384, 70_000] {
                let (key, value) = (vec![b'k'; key_len], vec![b'v'; value_len]);
                let mut buf = Vec::with_capacity(max_entry_bytes(key_len, value_len));
                append(&mut buf, KIND_OBJECT, 7, version, &key, &value);
                let h = header(&buf, 0);
                assert_eq!(
                    h,
                    header_general(&buf, 0),
                    "{version} {key_len} {value_len}"
                );
                assert_eq!(
                    (h.key_len, h.value_len, h.version),
                    (key_len, value_len, version)
                );
                assert_eq!(h.entry_len(), buf.len());
                // At a buffer's very end (no 8 bytes to load) too.
                let cut = &buf[..h.header_len];
                assert_eq!(header_general(cut, 0).header_len, h.header_len);
            }
        }
    }
}

#[test]
fn a_version_wider_than_needed_is_refused() {
    let mut buf = one_at(KIND_OBJECT, 5, b"k", b"v");
    // Re-encode version 5 in two bytes, with a valid CRC.
    buf[OFF_FLAGS] = KIND_OBJECT | 1 << VERSION_WIDTH_SHIFT;
    buf.insert(OFF_VERSION + 1, 0);
    let crc = checksum(7, &buf[..OFF_VERSION + 4], b"k", b"v");
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(parse(&buf, 0, 7, 64, 64), Err(Bad::Stop(_))));
}

#[test]
fn parse_accepts_valid_and_ignores_dead_flag() {
    let mut buf = one(KIND_OBJECT, b"k", b"v");
    let p = parse(&buf, 0, 7, 64, 64).expect("valid entry");
    assert_eq!(
        (p.key, p.value, p.version, p.next),
        (&b"k"[..], &b"v"[..], 42, buf.len())
    );
    set_dead(&mut buf, 0);
    assert!(is_dead(&buf, 0));
    assert_eq!(kind(&buf, 0), KIND_OBJECT);
    assert!(
        parse(&buf, 0, 7, 64, 64).is_ok(),
        "the dead flag is not covered by the CRC"
    );
}

/// Every single-bit flip of `buf` but the dead flag's is refused by `parse`.
fn assert_every_flip_refused(buf: &[u8]) {
    for i in 0..buf.len() {
        for bit in 0..8 {
            if i == OFF_FLAGS && 1 << bit == DEAD_BIT {
                continue;
            }
            let mut bad = buf.to_vec();
            bad[i] ^= 1 << bit;
            assert!(
                parse(&bad, 0, 7, 64, 64).is_err(),
                "flip of byte {i} bit {bit} went unnoticed"
            );
        }
    }
}

#[test]
fn parse_rejects_every_single_bit_flip_outside_the_dead_flag() {
    for version in [42, 1 << 40, u64::MAX - 1] {
        let buf = one_at(KIND_TOMBSTONE, version, b"abc", &9u64.to_le_bytes());
        assert_every_flip_refused(&buf);
    }
}

#[test]
fn parse_reports_end_truncation_and_wrong_table() {
    assert_eq!(parse(&[0u8; 100], 0, 7, 64, 64).unwrap_err(), Bad::End);
    assert_eq!(parse(&[0u8; 3], 0, 7, 64, 64).unwrap_err(), Bad::End);
    let buf = one(KIND_OBJECT, b"k", b"value");
    for cut in 1..buf.len() {
        assert!(
            matches!(parse(&buf[..cut], 0, 7, 64, 64), Err(Bad::Stop(_))),
            "cut at {cut}"
        );
    }
    // The table id seeds the CRC: an entry of another table fails it.
    assert!(matches!(parse(&buf, 0, 8, 64, 64), Err(Bad::Stop(_))));
    // Lengths beyond the configured limits are impossible, whatever the CRC says.
    assert!(matches!(parse(&buf, 0, 7, 64, 4), Err(Bad::Stop(_))));
}

#[test]
fn every_flag_bit_has_a_meaning_and_bit_6_on_a_plain_object_is_refused() {
    // Bit 5 became a kind bit for the side-record kinds, bit 6 the deadline.
    assert_eq!(RESERVED_BITS, 0);
    // Bit 6 set on an object written without a deadline moves its lengths:
    // the entry is refused (here: its deadline would run past the bytes).
    let mut buf = one(KIND_OBJECT, b"k", b"v");
    buf[OFF_FLAGS] |= 0x40;
    reseal(&mut buf);
    assert!(matches!(parse(&buf, 0, 7, 64, 64), Err(Bad::Stop(_))));
}

// ---- side records (KIND_RECORD, KIND_RECORD_REMOVED) ----------------------

fn record(version: u64, anchor: &[u8], id: RecordId, payload: &[u8]) -> Vec<u8> {
    let head = record_id_bytes(id);
    let mut buf = Vec::with_capacity(max_entry_bytes(anchor.len(), 9 + payload.len()));
    let len = append_parts(&mut buf, KIND_RECORD, 7, version, 0, anchor, &head, payload);
    assert_eq!(len, buf.len());
    buf
}

fn removal(version: u64, anchor: &[u8], id: RecordId, segment: u64) -> Vec<u8> {
    let mut buf = Vec::with_capacity(max_entry_bytes(anchor.len(), 17));
    append_parts(
        &mut buf,
        KIND_RECORD_REMOVED,
        7,
        version,
        0,
        anchor,
        &record_id_bytes(id),
        &segment.to_le_bytes(),
    );
    buf
}

/// Re-seal `buf`'s CRC after its header was edited; `buf` is one whole
/// entry of table 7 (the CRC covers its bytes from the flags on).
fn reseal(buf: &mut [u8]) {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&7u64.to_le_bytes()), &buf[4..]);
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
}

const RID: RecordId = RecordId {
    class: 3,
    id: 0x0102_0304_0506_0708,
};

#[test]
fn record_kinds_are_laid_out_as_documented_and_parse_back() {
    assert_eq!((KIND_BITS, RESERVED_BITS), (0x23, 0));
    let buf = record(300, b"anchor", RID, b"payload");
    assert_eq!(buf[OFF_FLAGS], 0x21 | 1 << VERSION_WIDTH_SHIFT);
    // Value: class, id LE, payload; one piece for the CRC.
    let h = header(&buf, 0);
    assert_eq!(h, header_general(&buf, 0), "fast and general paths agree");
    assert_eq!((h.kind, h.key_len, h.value_len), (KIND_RECORD, 6, 9 + 7));
    let value = &buf[h.header_len + 6..];
    assert_eq!(value[0], 3);
    assert_eq!(&value[1..9], &RID.id.to_le_bytes());
    assert_eq!(&value[9..], b"payload");
    let mut whole = Vec::with_capacity(buf.len());
    append(&mut whole, KIND_RECORD, 7, 300, b"anchor", value);
    assert_eq!(whole, buf, "a split value checksums as one");
    let p = parse(&buf, 0, 7, 64, 64).expect("valid record");
    assert_eq!(
        (p.kind, p.key, p.version),
        (KIND_RECORD, &b"anchor"[..], 300)
    );
    assert_eq!(split_record_value(p.value), Some((RID, &b"payload"[..])));
    let r = record_at(&buf, 0);
    assert_eq!(
        (r.id, r.anchor, r.payload, r.version),
        (RID, &b"anchor"[..], &b"payload"[..], 300)
    );
    assert_eq!(kind(&buf, 0), KIND_RECORD);
    // An empty payload is a record too.
    let empty = record(1, b"a", RID, b"");
    assert_eq!(
        parse(&empty, 0, 7, 64, 64)
            .expect("empty payload")
            .value
            .len(),
        9
    );

    let gone = removal(1 << 40, b"anchor", RID, 77);
    let p = parse(&gone, 0, 7, 64, 64).expect("valid removal");
    assert_eq!(p.kind, KIND_RECORD_REMOVED);
    assert_eq!(p.value.len(), RECORD_REMOVED_VALUE_BYTES);
    assert_eq!(
        split_record_value(p.value),
        Some((RID, &77u64.to_le_bytes()[..]))
    );
    assert_eq!(tombstone_segment(&gone, 0), 77);
    assert_eq!(kind(&gone, 0), KIND_RECORD_REMOVED);
    assert_eq!(split_record_value(&[1; 8]), None, "too short for an id");
}

#[test]
fn record_kinds_with_impossible_lengths_are_corrupt() {
    let stop = |buf: &[u8], max_value: usize| matches!(parse(buf, 0, 7, 64, max_value), Err(Bad::Stop(why)) if why.contains("impossible lengths"));
    // Whole entries with a valid CRC: only the lengths are wrong.
    for short in 0..9 {
        let buf = one(KIND_RECORD, b"anchor", &vec![1; short]);
        assert!(stop(&buf, 64), "record value of {short} bytes");
    }
    assert!(stop(&one(KIND_RECORD, b"", &[1; 12]), 64), "empty anchor");
    assert!(
        stop(&one(KIND_RECORD, &[b'k'; 65], &[1; 12]), 64),
        "anchor over max_key_bytes"
    );
    // Id and payload together are a write's value: at most max_value_bytes.
    let at_limit = one(KIND_RECORD, b"a", &[1; 64]);
    assert!(parse(&at_limit, 0, 7, 64, 64).is_ok());
    assert!(stop(&at_limit, 63), "record value over max_value_bytes");
    for len in [0, 8, 9, 16, 18, 100] {
        let buf = one(KIND_RECORD_REMOVED, b"anchor", &vec![1; len]);
        assert!(stop(&buf, 64), "removal value of {len} bytes");
    }
    assert!(
        stop(&one(KIND_RECORD_REMOVED, b"", &[1; 17]), 64),
        "removal without anchor"
    );
    assert!(parse(&one(KIND_RECORD_REMOVED, b"a", &[1; 17]), 0, 7, 64, 64).is_ok());
    // Bit 5 with the low kind bits of nothing or of a mark is no kind.
    for bad_kind in [0x20u8, 0x23] {
        let mut buf = one(KIND_OBJECT, b"k", &[1; 20]);
        buf[OFF_FLAGS] = (buf[OFF_FLAGS] & !KIND_BITS) | bad_kind;
        reseal(&mut buf);
        assert!(
            matches!(parse(&buf, 0, 7, 64, 64), Err(Bad::Stop(why)) if why.contains("unknown entry kind")),
            "kind {bad_kind:#x}"
        );
    }
}

#[test]
fn record_kinds_refuse_bit_6_and_every_single_bit_flip() {
    for buf in [
        record(42, b"abc", RID, b"pay"),
        record(u64::MAX - 1, b"abc", RID, b""),
        removal(1 << 20, b"abc", RID, 5),
    ] {
        // Bit 6 (a deadline) belongs to objects only: with the CRC resealed
        // the entry is still refused, and its lengths are not trusted.
        let mut six = buf.clone();
        six[OFF_FLAGS] |= 0x40;
        reseal(&mut six);
        assert!(matches!(parse(&six, 0, 7, 64, 64), Err(Bad::Stop(_))));
        assert_every_flip_refused(&buf);
    }
    // Bit 5 flipped on an object (value >= 9) turns it into a record: the
    // CRC, which covers the flags, refuses it.
    let mut obj = one(KIND_OBJECT, b"k", &[1; 20]);
    obj[OFF_FLAGS] ^= 0x20;
    assert!(matches!(parse(&obj, 0, 7, 64, 64), Err(Bad::Stop(why)) if why.contains("checksum")));
}
