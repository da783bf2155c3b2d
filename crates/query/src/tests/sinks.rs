//! Sinks: a Rows page stops at its limit or its byte budget, later pages
//! count the rows already sent, reset forgets; the group limit; exact
//! decimal arithmetic; overflow is an error.

use insitu_protocol::query::{
    AggFunc, AggSpec, MAX_GROUPS, QueryData, QueryOutput, QueryPlan, Scalar, ValueOp,
};
use insitu_protocol::schema::{Column, ColumnType, Schema};
use insitu_rows::arrow::{batch_row, from_ipc};
use insitu_rows::{RowLayout, RowRef, encode_row};

use super::schema;
use crate::{Compiled, QueryError, compile};

fn rows_of(n: i64) -> Vec<Vec<u8>> {
    let mut rows = Vec::new();
    for id in 0..n {
        let mut r = vec![Scalar::Null; 10];
        r[0] = Scalar::Int(id);
        r[7] = Scalar::Str("x".repeat(100));
        rows.push(r);
    }
    super::encode(&rows)
}

fn push_all(c: &Compiled, sink: &mut crate::Sink, rows: &[Vec<u8>]) -> usize {
    let mut pushed = 0;
    for b in rows {
        if sink.is_full() {
            break;
        }
        let row = RowRef::new(c.layout(), b).unwrap();
        if c.filter(&row) {
            sink.push(&row).unwrap();
            pushed += 1;
        }
    }
    pushed
}

fn ids(data: QueryData) -> Vec<i64> {
    let QueryData::Rows(ipc) = data else {
        panic!("rows")
    };
    from_ipc(&ipc)
        .unwrap()
        .iter()
        .flat_map(|b| (0..b.num_rows()).map(move |i| batch_row(b, i).unwrap()))
        .map(|r| match r[0] {
            Scalar::Int(i) => i,
            _ => panic!("id"),
        })
        .collect()
}

fn rows_plan(limit: Option<u64>) -> QueryPlan {
    QueryPlan {
        filter: vec![],
        output: QueryOutput::Rows {
            columns: vec![0, 7],
            order_by: vec![],
            limit,
        },
    }
}

#[test]
fn a_rows_page_stops_at_the_limit_and_says_so() {
    let c = compile(&schema(), &rows_plan(Some(5))).unwrap();
    let rows = rows_of(20);
    let mut sink = c.sink(1 << 20);
    assert_eq!(push_all(&c, &mut sink, &rows), 5);
    assert!(sink.is_full() && sink.rows_limit_reached());
    assert_eq!(ids(sink.finish().unwrap()), vec![0, 1, 2, 3, 4]);
}

#[test]
fn pages_stop_at_the_byte_budget_and_later_pages_count_rows_sent() {
    let c = compile(&schema(), &rows_plan(Some(15))).unwrap();
    let rows = rows_of(20);
    // ~116 bytes a row: a 500-byte page holds 5.
    let mut sink = c.sink(500);
    assert_eq!(push_all(&c, &mut sink, &rows), 5);
    assert!(sink.is_full() && !sink.rows_limit_reached());
    assert_eq!(ids(sink.finish().unwrap()), vec![0, 1, 2, 3, 4]);
    let mut sink = c.sink_after(1 << 20, 5);
    assert_eq!(push_all(&c, &mut sink, &rows[5..]), 10);
    assert!(sink.rows_limit_reached());
    assert_eq!(ids(sink.finish().unwrap()), (5..15).collect::<Vec<_>>());
}

#[test]
fn reset_forgets_every_row_pushed() {
    let c = compile(&schema(), &rows_plan(None)).unwrap();
    let rows = rows_of(6);
    let mut sink = c.sink(1 << 20);
    push_all(&c, &mut sink, &rows[..3]);
    sink.reset();
    assert!(sink.is_empty());
    push_all(&c, &mut sink, &rows[3..]);
    assert_eq!(ids(sink.finish().unwrap()), vec![3, 4, 5]);
}

fn agg_plan(group_by: Vec<u16>, arg: Vec<ValueOp>, func: AggFunc) -> QueryPlan {
    QueryPlan {
        filter: vec![],
        output: QueryOutput::Aggregate {
            group_by,
            aggs: vec![AggSpec { func, arg }],
        },
    }
}

#[test]
fn more_groups_than_the_limit_is_a_clear_error() {
    let c = compile(&schema(), &agg_plan(vec![0], vec![], AggFunc::CountStar)).unwrap();
    let mut sink = c.sink(0);
    let layout = RowLayout::new(&schema());
    let mut r = vec![Scalar::Null; 10];
    for id in 0..MAX_GROUPS as i64 {
        r[0] = Scalar::Int(id);
        let b = encode_row(&schema(), &layout, &r).unwrap();
        sink.push(&RowRef::new(&layout, &b).unwrap()).unwrap();
    }
    r[0] = Scalar::Int(-1);
    let b = encode_row(&schema(), &layout, &r).unwrap();
    let e = sink.push(&RowRef::new(&layout, &b).unwrap()).unwrap_err();
    assert!(
        e.to_string()
            .contains("too many groups (more than 100000) for the servers"),
        "{e}"
    );
}

/// Packed group keys (`agg.rs` `small_key`) keep text lengths: without
/// them ("a", "b") and ("a\u{1}b", NULL) pack to the same 16 bytes
/// (1 a 1 b, then zero padding).
#[test]
fn packed_group_keys_do_not_run_into_each_other() {
    let c = compile(&schema(), &agg_plan(vec![7, 8], vec![], AggFunc::CountStar)).unwrap();
    let mut sink = c.sink(0);
    let layout = RowLayout::new(&schema());
    let texts = [
        (Scalar::Str("a".into()), Scalar::Str("b".into())),
        (Scalar::Str("a\u{1}b".into()), Scalar::Null),
        (Scalar::Str("a".into()), Scalar::Str("b".into())),
        // 20 bytes of key: past the packed form, grouped by the byte key.
        (Scalar::Str("x".repeat(9)), Scalar::Str("y".repeat(5))),
        (Scalar::Str("x".repeat(9)), Scalar::Str("y".repeat(5))),
    ];
    for (i, (s, t)) in texts.into_iter().enumerate() {
        let mut r = vec![Scalar::Null; 10];
        r[0] = Scalar::Int(i as i64);
        r[7] = s;
        r[8] = t;
        let b = encode_row(&schema(), &layout, &r).unwrap();
        sink.push(&RowRef::new(&layout, &b).unwrap()).unwrap();
    }
    let QueryData::Groups(groups) = sink.finish().unwrap() else {
        panic!("groups")
    };
    let counts: Vec<u64> = groups.iter().map(|g| g.states[0].count).collect();
    assert_eq!(counts, vec![2, 1, 2], "{groups:?}");
}

fn one_column_schema(ty: ColumnType) -> Schema {
    Schema {
        columns: vec![Column::new("x", ty, true)],
        key: vec![],
    }
}

/// Final aggregate rows of `plan` over one-column rows `values`.
fn aggregate(
    ty: ColumnType,
    plan: &QueryPlan,
    values: &[Scalar],
) -> Result<Vec<Vec<Scalar>>, QueryError> {
    let mut s = one_column_schema(ty);
    s.columns.push(Column::new("k", ColumnType::Int64, false));
    s.key = vec![1];
    let layout = RowLayout::new(&s);
    let c = compile(&s, plan)?;
    let mut sink = c.sink(0);
    for (i, v) in values.iter().enumerate() {
        let b = encode_row(&s, &layout, &[v.clone(), Scalar::Int(i as i64)]).unwrap();
        sink.push(&RowRef::new(&layout, &b).unwrap())?;
    }
    let QueryData::Groups(g) = sink.finish()? else {
        panic!("groups")
    };
    let merged = crate::merge_groups(plan, vec![g])?;
    let batch = crate::finalize_groups(&s, plan, &merged)?;
    Ok((0..batch.num_rows())
        .map(|i| batch_row(&batch, i).unwrap())
        .collect())
}

#[test]
fn decimal_arithmetic_is_exact_and_typed() {
    let dec = ColumnType::Decimal {
        precision: 15,
        scale: 2,
    };
    let d = |value| Scalar::Decimal { value, scale: 2 };
    // sum(x * (1 - 0.06)): 0.10 * 0.94 + 0.20 * 0.94 = 0.2820 exactly.
    let arg = vec![
        ValueOp::Col(0),
        ValueOp::Lit(Scalar::Int(1)),
        ValueOp::Lit(Scalar::Decimal { value: 6, scale: 2 }),
        ValueOp::Sub,
        ValueOp::Mul,
    ];
    let plan = agg_plan(vec![], arg, AggFunc::Sum);
    let out = aggregate(dec, &plan, &[d(10), Scalar::Null, d(20)]).unwrap();
    assert_eq!(
        out,
        vec![vec![Scalar::Decimal {
            value: 2820,
            scale: 4
        }]]
    );
    let s = one_column_schema(dec);
    let mut s2 = s.clone();
    s2.columns.push(Column::new("k", ColumnType::Int64, false));
    s2.key = vec![1];
    let batch = crate::finalize_groups(&s2, &plan, &[]).unwrap();
    assert_eq!(batch.schema().field(0).name(), "sum(x * (1 - 0.06))");
    assert_eq!(
        batch.schema().field(0).data_type(),
        &arrow_schema::DataType::Decimal128(38, 4)
    );
    // Over no rows: one row, sum NULL; count(*) 0.
    let out = aggregate(dec, &plan, &[]).unwrap();
    assert_eq!(out, vec![vec![Scalar::Null]]);
    let out = aggregate(dec, &agg_plan(vec![], vec![], AggFunc::CountStar), &[]).unwrap();
    assert_eq!(out, vec![vec![Scalar::Int(0)]]);
}

#[test]
fn integer_overflow_is_an_error_not_a_wrapped_value() {
    let big = Scalar::Int(i64::MAX);
    // The i128 sum is fine; int64 output is not.
    let e = aggregate(
        ColumnType::Int64,
        &agg_plan(vec![], vec![ValueOp::Col(0)], AggFunc::Sum),
        &[big.clone(), big.clone()],
    )
    .unwrap_err();
    assert!(e.to_string().contains("does not fit int64"), "{e}");
    // x*x*x overflows i128 itself.
    let arg = vec![
        ValueOp::Col(0),
        ValueOp::Col(0),
        ValueOp::Mul,
        ValueOp::Col(0),
        ValueOp::Mul,
    ];
    let e = aggregate(
        ColumnType::Int64,
        &agg_plan(vec![], arg, AggFunc::Sum),
        &[big],
    )
    .unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
}

#[test]
fn plans_and_sinks_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Compiled>();
    send::<crate::Sink>();
}

#[test]
fn a_projection_of_no_columns_still_counts_rows() {
    let plan = QueryPlan {
        filter: vec![],
        output: QueryOutput::Rows {
            columns: vec![],
            order_by: vec![],
            limit: None,
        },
    };
    let c = compile(&schema(), &plan).unwrap();
    let mut sink = c.sink(1 << 20);
    push_all(&c, &mut sink, &rows_of(3));
    let QueryData::Rows(ipc) = sink.finish().unwrap() else {
        panic!("rows")
    };
    let batches = from_ipc(&ipc).unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
}
