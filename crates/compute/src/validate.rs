//! The whole-plan check, run by the server before any work and by the
//! client before sending: predicate discipline, operation bounds and types.
//! It returns how many bytes a value needs for everything the plan reads,
//! so the scan checks each value's length once.

use insitu_protocol::plan::{MAX_DIMS, Op, PredOp, ScanPlan, Source};

use crate::json::check_path;
use crate::json_doc::{JsonDoc, op_path};
use crate::predicate::validate_predicate;
use crate::update::check_action;

/// Most integer keys one `IntKeys` plan may look up: every key is a lookup
/// whether or not it exists, so this bounds one request's work (~2^27 lookups,
/// seconds of yielding work) far above any table a server's memory holds.
pub const MAX_INT_KEYS: u64 = 1 << 27;

/// Bytes a value needs for everything the plan reads; or why the plan is invalid.
pub fn validate_plan(plan: &ScanPlan) -> Result<usize, String> {
    let mut need = validate_predicate(&plan.filter)?;
    match &plan.op {
        Op::Count => {}
        Op::Aggregate { field } => need = need.max(field.end()),
        Op::Update { field, action } => {
            need = need.max(field.end());
            check_action(*field, *action)?;
        }
        // Its filter and column are checked against the schema by
        // `insitu_query::RowUpdate`; the raw filter would read row bytes as
        // untyped fields.
        Op::UpdateRows { .. } | Op::RemoveRows { .. } if !plan.filter.is_empty() => {
            return Err(
                "a typed update or removal carries its filter in the operation; the plan's raw filter must be empty"
                    .into(),
            );
        }
        Op::UpdateRows { .. } | Op::RemoveRows { .. } | Op::Remove => {}
        Op::Gradient {
            layout, weights, ..
        } => {
            if layout.dims == 0 || layout.dims > MAX_DIMS {
                return Err(format!("dims must be in 1..={MAX_DIMS}"));
            }
            if weights.len() != layout.dims as usize {
                return Err(format!(
                    "{} weights for {} dimensions",
                    weights.len(),
                    layout.dims
                ));
            }
            need = need.max(layout.end());
        }
        // A JSON number needs no length: a value without it is skipped.
        Op::JsonAggregate { path } => {
            check_path(path)?;
            // The filter's paths and this one, read in one pass per object.
            JsonDoc::for_plan(&plan.filter, op_path(&plan.op))?;
        }
    }
    if let Source::IntKeys { from, to } = plan.source {
        if from > to {
            return Err(format!("key range {from}..{to} is reversed"));
        }
        if to - from > MAX_INT_KEYS {
            return Err(format!(
                "key range {from}..{to} has more than {MAX_INT_KEYS} keys"
            ));
        }
    }
    Ok(need)
}

/// What a plan needs from a value, for the "short value" error.
pub fn describe_need(plan: &ScanPlan) -> String {
    let mut parts: Vec<String> = plan
        .filter
        .iter()
        .filter_map(|p| match p {
            PredOp::Cmp { field, .. } | PredOp::Between { field, .. } => Some(field.to_string()),
            _ => None,
        })
        .collect();
    match &plan.op {
        Op::Aggregate { field } | Op::Update { field, .. } => parts.push(field.to_string()),
        Op::Gradient { layout, .. } => parts.push(format!(
            "f32x{}@{} and label u8@{}",
            layout.dims, layout.offset, layout.label_offset
        )),
        // JSON paths need no length (a value without one is like NULL).
        Op::Count
        | Op::UpdateRows { .. }
        | Op::Remove
        | Op::RemoveRows { .. }
        | Op::JsonAggregate { .. } => {}
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_protocol::Number;
    use insitu_protocol::plan::{Field, JsonPath, JsonStep, PointLayout, UpdateAction};

    #[test]
    fn plans_are_checked() {
        let agg = ScanPlan::new(Op::Aggregate {
            field: Field::I32(4),
        });
        assert_eq!(validate_plan(&agg), Ok(8));
        let frac = ScanPlan::new(Op::Update {
            field: Field::I64(0),
            action: UpdateAction::Add(Number::F64(0.5)),
        });
        assert!(validate_plan(&frac).unwrap_err().contains("fractional"));
        let too_big = ScanPlan::new(Op::Update {
            field: Field::U8(0),
            action: UpdateAction::Set(Number::I64(300)),
        });
        assert!(
            validate_plan(&too_big)
                .unwrap_err()
                .contains("out of range")
        );
        let grad = |dims, weights: usize| {
            ScanPlan::new(Op::Gradient {
                layout: PointLayout {
                    offset: 0,
                    dims,
                    label_offset: 4 * dims,
                },
                weights: vec![0.0; weights],
                bias: 0.0,
            })
        };
        assert_eq!(validate_plan(&grad(3, 3)), Ok(13));
        assert!(validate_plan(&grad(0, 0)).is_err());
        assert!(
            validate_plan(&grad(3, 2))
                .unwrap_err()
                .contains("2 weights")
        );
        let mut reversed = ScanPlan::new(Op::Count);
        reversed.source = Source::IntKeys { from: 5, to: 1 };
        assert!(validate_plan(&reversed).unwrap_err().contains("reversed"));
        reversed.source = Source::IntKeys {
            from: 0,
            to: MAX_INT_KEYS + 1,
        };
        assert!(validate_plan(&reversed).is_err());
        assert_eq!(describe_need(&agg), "i32@4");
    }

    #[test]
    fn json_plans_need_no_length_and_few_paths() {
        use crate::expr::parse_where;
        use crate::json::parse_path;
        let mut plan = ScanPlan::new(Op::JsonAggregate {
            path: parse_path("$.age").unwrap(),
        });
        assert_eq!(validate_plan(&plan), Ok(0));
        assert_eq!(describe_need(&plan), "");
        plan.filter = parse_where("$.name = 'bob' and u8@3 = 1").unwrap();
        assert_eq!(validate_plan(&plan), Ok(4));
        assert_eq!(describe_need(&plan), "u8@3");
        // 32 paths in the filter, the most; the operation's is a 33rd
        // unless the filter reads it too.
        let text: Vec<String> = (0..32).map(|i| format!("$.k{i} = 1")).collect();
        plan.filter = parse_where(&text.join(" or ")).unwrap();
        assert!(validate_plan(&plan).unwrap_err().contains("at most 32"));
        plan.op = Op::JsonAggregate {
            path: parse_path("$.k7").unwrap(),
        };
        assert_eq!(validate_plan(&plan), Ok(0));
        let deep = JsonPath {
            steps: vec![JsonStep::Index(0); 17],
        };
        let plan = ScanPlan::new(Op::JsonAggregate { path: deep });
        assert!(validate_plan(&plan).unwrap_err().contains("17 steps"));
    }
}
