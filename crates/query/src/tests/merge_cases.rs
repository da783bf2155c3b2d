//! The client's merges refuse answers that do not fit the query (a server
//! is not trusted to send the right shapes) instead of panicking.

use std::sync::Arc;

use arrow_array::{Int32Array, RecordBatch};
use insitu_protocol::query::{
    AggFunc, AggSpec, AggState, GroupPartial, QueryOutput, QueryPlan, Scalar, SortKey, ValueOp,
};

use super::schema;
use crate::{QueryError, finalize_groups, merge_groups, merge_top_k};

fn state(min: Scalar) -> AggState {
    AggState {
        count: 1,
        sum_int: 0,
        sum_float: 0.0,
        min: min.clone(),
        max: min,
    }
}

fn min_plan() -> QueryPlan {
    QueryPlan {
        filter: vec![],
        output: QueryOutput::Aggregate {
            group_by: vec![1],
            aggs: vec![AggSpec {
                func: AggFunc::Min,
                arg: vec![ValueOp::Col(2)],
            }],
        },
    }
}

#[test]
fn groups_of_the_wrong_shape_or_kind_are_refused() {
    let plan = min_plan();
    let wrong_arity = GroupPartial {
        key: vec![],
        states: vec![state(Scalar::Int(1))],
    };
    let e = merge_groups(&plan, vec![vec![wrong_arity]]).unwrap_err();
    assert!(e.to_string().contains("does not fit the query"), "{e}");
    let a = GroupPartial {
        key: vec![Scalar::Int(1)],
        states: vec![state(Scalar::Int(1))],
    };
    let b = GroupPartial {
        key: vec![Scalar::Int(1)],
        states: vec![state(Scalar::Str("x".into()))],
    };
    let e = merge_groups(&plan, vec![vec![a.clone()], vec![b]]).unwrap_err();
    assert!(e.to_string().contains("do not compare"), "{e}");
    // A key that does not fit its column's Arrow type.
    let big = GroupPartial {
        key: vec![Scalar::Int(1 << 40)],
        states: vec![state(Scalar::Int(1))],
    };
    let e = finalize_groups(&schema(), &plan, &[big]).unwrap_err();
    assert!(matches!(e, QueryError::Arrow(_)), "{e}");
    // Merging the same group from two tablets keeps the smaller min.
    let c = GroupPartial {
        key: vec![Scalar::Int(1)],
        states: vec![state(Scalar::Int(-3))],
    };
    let merged = merge_groups(&plan, vec![vec![a], vec![c]]).unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].states[0].min, Scalar::Int(-3));
    assert_eq!(merged[0].states[0].count, 2);
}

#[test]
fn top_k_batches_of_the_wrong_types_are_refused() {
    let plan = QueryPlan {
        filter: vec![],
        output: QueryOutput::Rows {
            columns: vec![2],
            order_by: vec![SortKey {
                col: 2,
                descending: false,
                nulls_first: false,
            }],
            limit: Some(3),
        },
    };
    // Column 2 is int64; a server sent int32.
    let field = arrow_schema::Field::new("q", arrow_schema::DataType::Int32, true);
    let batch = RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(vec![field])),
        vec![Arc::new(Int32Array::from(vec![1, 2]))],
    )
    .unwrap();
    let e = merge_top_k(&schema(), &plan, vec![batch]).unwrap_err();
    assert!(e.to_string().contains("does not fit the query"), "{e}");
    // No batches at all: one empty batch of the projection.
    let out = merge_top_k(&schema(), &plan, vec![]).unwrap();
    assert_eq!(
        (out.len(), out[0].num_rows(), out[0].num_columns()),
        (1, 0, 1)
    );
}
