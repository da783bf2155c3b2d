//! Any bytes as a transaction's durable record payload (a prepared record,
//! a commit record), as a recovery reads them back from a replica: decoding
//! must never panic nor reserve memory for a count it was not given, and a
//! prepared record it accepts is exactly what encoding that record writes
//! (every byte has one meaning, so two different payloads never decode to
//! one record).
#![no_main]

use insitu_txn::record::{PreparedRecord, decode_commit_payload};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = PreparedRecord::decode(data) {
        let again = record.encode();
        assert_eq!(again, data, "a decoded record encodes to other bytes");
        assert_eq!(record.encoded_len(), data.len());
    }
    if let Ok(ts) = decode_commit_payload(data) {
        assert!(data.is_empty() || data == ts.to_le_bytes());
    }
});
