//! A plain, synchronous evaluation of a whole plan over objects in memory:
//! the same checks and kernels a shard runs, without chunks or an engine.
//! The fuzz target and in-memory references use it.

use insitu_protocol::plan::{Field, Op, Partial, ScanPlan};

use crate::aggregate::{F64AggK, IntAggK, JsonAggK};
use crate::kernel::{CountK, GradK, Kernel, KeysK, Visit};
use crate::update::new_value;
use crate::validate::{describe_need, validate_plan};

/// What a plan computes over `objects` (key, value), or why it is refused:
/// an invalid plan, a value too short for it, or an update an object cannot
/// take. An update is evaluated (every new value computed), not applied.
pub fn evaluate(plan: &ScanPlan, objects: &[(&[u8], &[u8])]) -> Result<Partial, String> {
    let need = validate_plan(plan)?;
    fn run<K: Kernel>(
        plan: &ScanPlan,
        need: usize,
        objects: &[(&[u8], &[u8])],
        kernel: K,
    ) -> Result<K, String> {
        let mut v: Visit<'_, K, true> = Visit::new(kernel, need, plan);
        for (k, val) in objects {
            v.object(k, val);
        }
        if let Some((_, len)) = v.short {
            return Err(format!(
                "a value of {len} bytes is too short for {} (needs {need} bytes)",
                describe_need(plan)
            ));
        }
        Ok(v.kernel)
    }
    Ok(match &plan.op {
        Op::Count => Partial::Count(run(plan, need, objects, CountK::default())?.0),
        Op::Aggregate { field } => {
            let off = field.offset();
            Partial::Aggregate(match field {
                Field::I32(_) => run(plan, need, objects, IntAggK::<4>::new(off))?.partial(),
                Field::I64(_) => run(plan, need, objects, IntAggK::<8>::new(off))?.partial(),
                Field::U8(_) => run(plan, need, objects, IntAggK::<1>::new(off))?.partial(),
                Field::F64(_) => run(plan, need, objects, F64AggK::new(off))?.out,
            })
        }
        Op::Gradient {
            layout,
            weights,
            bias,
        } => {
            let k = GradK::new(layout, weights, *bias);
            Partial::Gradient(run(plan, need, objects, k)?.acc.finish())
        }
        Op::JsonAggregate { path } => {
            Partial::Aggregate(run(plan, need, objects, JsonAggK::new(path))?.out)
        }
        Op::Update { field, action } => {
            let keys = run(plan, need, objects, KeysK::default())?.0;
            let mut updated = 0;
            for (k, val) in objects {
                if keys.iter().any(|m| m == k) {
                    new_value(*field, *action, val)?;
                    updated += 1;
                }
            }
            Partial::Update { updated }
        }
        Op::Remove => Partial::Update {
            updated: run(plan, need, objects, KeysK::default())?.0.len() as u64,
        },
        Op::UpdateRows { .. } | Op::RemoveRows { .. } => {
            return Err(
                "a typed update or removal reads rows by their schema: insitu-query evaluates it"
                    .into(),
            );
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_protocol::Number;
    use insitu_protocol::plan::{AggPartial, UpdateAction};
    use proptest::prelude::*;

    #[test]
    fn evaluates_like_a_shard() {
        let vals: Vec<[u8; 8]> = (0..5i64).map(|i| i.to_le_bytes()).collect();
        let objs: Vec<(&[u8], &[u8])> = vals.iter().map(|v| (&b"k"[..], &v[..])).collect();
        let agg = ScanPlan::new(Op::Aggregate {
            field: Field::I64(0),
        });
        let Partial::Aggregate(AggPartial { count, sum_int, .. }) = evaluate(&agg, &objs).unwrap()
        else {
            panic!("aggregate");
        };
        assert_eq!((count, sum_int), (5, 10));
        let short = [(&b"k"[..], &b"abc"[..])];
        assert!(evaluate(&agg, &short).unwrap_err().contains("too short"));
        let add = ScanPlan::new(Op::Update {
            field: Field::I64(0),
            action: UpdateAction::Add(Number::I64(i64::MAX)),
        });
        assert!(evaluate(&add, &objs).unwrap_err().contains("out of range"));
    }

    proptest! {
        // Fuzz smoke (the `fuzz/` plan_evaluator target, bounded): any bytes
        // that decode as a plan, over any values, give a result or an error.
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        #[test]
        fn random_plans_over_random_values_never_panic(
            plan in proptest::collection::vec(any::<u8>(), 0..64),
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..48), 0..8),
        ) {
            let objs: Vec<(&[u8], &[u8])> =
                values.iter().map(|v| (&v[..1.min(v.len())], &v[..])).collect();
            // As is, and after a `Log, no key range` prefix so that more
            // inputs decode to a plan with a predicate and an operation.
            let prefixed: Vec<u8> = [0, 0].iter().chain(&plan).copied().collect();
            for bytes in [&plan, &prefixed] {
                if let Ok(plan) = postcard::from_bytes::<ScanPlan>(bytes) {
                    let _ = evaluate(&plan, &objs);
                }
            }
        }
    }
}
