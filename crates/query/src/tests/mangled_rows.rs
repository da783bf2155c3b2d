//! Rows a hostile or buggy client wrote. A typed row is encoded by the
//! client and a server stores a value as given, so any bytes may sit in a
//! typed table's log: every plan a shard runs must meet a mangled row with
//! a skip or a clear error, never a panic or an out-of-bounds read. Valid
//! rows are mangled (bytes and 4-byte words set anywhere, so offsets of the
//! offset table too; cut short; lengthened) and run the way a shard's scan
//! runs them (`rejects`, then `keep_unrejected`, then the sink), for plain
//! rows, top-k and grouped aggregates.

use insitu_protocol::query::{AggSpec, QueryOutput, QueryPlan, SortKey};
use insitu_rows::RowRef;
use proptest::prelude::*;

use super::agg_props::agg;
use super::filter_props::program;
use super::{encode, rows, schema};

/// One change to a row's bytes; positions are taken modulo its length.
#[derive(Clone, Debug)]
enum Mangle {
    Byte {
        at: usize,
        value: u8,
    },
    /// A little-endian word: an offset of the offset table when it lands there.
    Word {
        at: usize,
        value: u32,
    },
    Cut {
        keep: usize,
    },
    Grow {
        bytes: Vec<u8>,
    },
}

fn mangle() -> BoxedStrategy<Mangle> {
    prop_oneof![
        3 => (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mangle::Byte { at, value }),
        3 => (any::<usize>(), prop_oneof![any::<u32>(), 0u32..64, Just(u32::MAX)])
            .prop_map(|(at, value)| Mangle::Word { at, value }),
        1 => any::<usize>().prop_map(|keep| Mangle::Cut { keep }),
        1 => proptest::collection::vec(any::<u8>(), 1..16).prop_map(|bytes| Mangle::Grow { bytes }),
    ]
    .boxed()
}

fn apply(row: &mut Vec<u8>, m: &Mangle) {
    let n = row.len();
    match m {
        Mangle::Byte { at, value } if n > 0 => row[at % n] = *value,
        Mangle::Word { at, value } if n >= 4 => {
            let at = at % (n - 3);
            row[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
        Mangle::Cut { keep } => row.truncate(keep % (n + 1)),
        Mangle::Grow { bytes } => row.extend_from_slice(bytes),
        _ => {}
    }
}

/// Any output a shard computes: rows (with or without a limit), top-k, or
/// grouped aggregates.
fn output() -> BoxedStrategy<QueryOutput> {
    let columns = proptest::collection::vec(0u16..10, 0..5);
    prop_oneof![
        (columns.clone(), proptest::option::of(0u64..5)).prop_map(|(columns, limit)| {
            QueryOutput::Rows {
                columns,
                order_by: vec![],
                limit,
            }
        }),
        (
            columns,
            proptest::collection::vec((0u16..10, any::<bool>(), any::<bool>()), 1..3),
            0u64..5
        )
            .prop_map(|(columns, keys, limit)| QueryOutput::Rows {
                columns,
                order_by: keys
                    .into_iter()
                    .map(|(col, descending, nulls_first)| SortKey {
                        col,
                        descending,
                        nulls_first,
                    })
                    .collect(),
                limit: Some(limit),
            }),
        (
            proptest::collection::vec(0u16..10, 0..3),
            proptest::collection::vec(agg(), 1..4)
        )
            .prop_map(|(group_by, aggs): (Vec<u16>, Vec<AggSpec>)| {
                QueryOutput::Aggregate { group_by, aggs }
            }),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn mangled_rows_are_skipped_or_refused_never_a_panic(
        rows in rows(12),
        mangles in proptest::collection::vec((0usize..12, proptest::collection::vec(mangle(), 1..4)), 0..12),
        filter in prop_oneof![Just(vec![]), program()],
        output in output(),
    ) {
        let s = schema();
        let plan = QueryPlan { filter, output };
        let Ok(compiled) = crate::compile(&s, &plan) else {
            // A plan the generators made invalid (a sum of text, say) is
            // refused before any row is read: nothing to run.
            return Ok(());
        };
        let mut values = encode(&rows);
        for (i, ms) in &mangles {
            if let Some(v) = values.get_mut(*i) {
                ms.iter().for_each(|m| apply(v, m));
            }
        }
        let mut sink = compiled.sink(1 << 20);
        for v in &values {
            // As a shard's walk runs a row: the cheap first look, then the rest.
            let kept = if compiled.rejects(v) {
                prop_assert!(matches!(compiled.keep(v), Ok(None)), "rejects but keep does not");
                None
            } else {
                let rest = compiled.keep_unrejected(v);
                let whole = compiled.keep(v);
                prop_assert_eq!(
                    rest.as_ref().map(|r| r.is_some()).map_err(|e| e.to_string()),
                    whole.as_ref().map(|r| r.is_some()).map_err(|e| e.to_string())
                );
                // A malformed row is an error of its own (the scan reports it).
                rest.ok().flatten()
            };
            let Some(row) = kept else { continue };
            // What a filter keeps was checked whole before any sink reads it.
            prop_assert!(RowRef::new(compiled.layout(), v).is_ok(), "kept a row that does not check");
            prop_assert_eq!(row.bytes(), v.as_slice());
            for col in 0..s.columns.len() {
                let _ = row.scalar(col);
            }
            let _ = compiled.truth(&row);
            // Overflow or a too-large answer is an error, not a panic.
            if sink.push(&row).is_err() {
                break;
            }
        }
        let _ = sink.finish();
    }
}
