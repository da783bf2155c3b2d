//! A plain, synchronous evaluation of a whole plan over objects in memory:
//! the same checks and kernels a shard runs, without chunks or an engine.
//! The fuzz target and in-memory references use it. A shard runs the
//! read-only operations through the same `read_op`, in chunks.

use insitu_protocol::plan::{Field, Op, Partial, ScanPlan};

use crate::aggregate::{F64AggK, IntAggK, JsonAggK};
use crate::kernel::{CountK, GradK, Kernel, KeysK, Visit};
use crate::update::new_value;
use crate::validate::{describe_need, validate_plan};

/// How a read-only operation's kernel runs (`read_op`): over objects in
/// memory at once (`evaluate`), or over a tablet in chunks (a shard).
pub trait RunKernel {
    /// What a run gives: the operation's result, or a future of it.
    type Out;
    /// Run `kernel`, then make the operation's result of it with `finish`.
    fn run<K: Kernel + 'static>(self, kernel: K, finish: fn(K) -> Partial) -> Self::Out;
}

/// Run a read-only operation's kernel with `runner` (None: `op` writes): one
/// choice of kernel and of result, so a shard and the reference agree.
pub fn read_op<R: RunKernel>(op: &Op, runner: R) -> Option<R::Out> {
    Some(match op {
        Op::Count => runner.run(CountK::default(), |k| Partial::Count(k.0)),
        Op::Aggregate { field } => {
            let off = field.offset();
            match field {
                Field::I32(_) => {
                    runner.run(IntAggK::<4>::new(off), |k| Partial::Aggregate(k.partial()))
                }
                Field::I64(_) => {
                    runner.run(IntAggK::<8>::new(off), |k| Partial::Aggregate(k.partial()))
                }
                Field::U8(_) => {
                    runner.run(IntAggK::<1>::new(off), |k| Partial::Aggregate(k.partial()))
                }
                Field::F64(_) => runner.run(F64AggK::new(off), |k| Partial::Aggregate(k.out)),
            }
        }
        Op::Gradient {
            layout,
            weights,
            bias,
        } => {
            let k = GradK::new(layout, weights, *bias);
            runner.run(k, |k| Partial::Gradient(k.acc.finish()))
        }
        Op::JsonAggregate { path } => {
            runner.run(JsonAggK::new(path), |k| Partial::Aggregate(k.out))
        }
        Op::Update { .. } | Op::Remove | Op::UpdateRows { .. } | Op::RemoveRows { .. } => {
            return None;
        }
    })
}

/// `plan`'s kernels over objects in memory, all at once (`evaluate`).
struct AtOnce<'a> {
    plan: &'a ScanPlan,
    /// Bytes a value needs (`validate_plan`).
    need: usize,
    objects: &'a [(&'a [u8], &'a [u8])],
}

impl AtOnce<'_> {
    /// `kernel` over every object, or why a value is too short for the plan.
    fn visit<K: Kernel>(&self, kernel: K) -> Result<K, String> {
        let (plan, need) = (self.plan, self.need);
        let mut v: Visit<'_, K, true> = Visit::new(kernel, need, plan);
        for (k, val) in self.objects {
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
}

impl RunKernel for AtOnce<'_> {
    type Out = Result<Partial, String>;
    fn run<K: Kernel + 'static>(self, kernel: K, finish: fn(K) -> Partial) -> Self::Out {
        self.visit(kernel).map(finish)
    }
}

/// What a plan computes over `objects` (key, value), or why it is refused:
/// an invalid plan, a value too short for it, or an update an object cannot
/// take. An update is evaluated (every new value computed), not applied.
pub fn evaluate(plan: &ScanPlan, objects: &[(&[u8], &[u8])]) -> Result<Partial, String> {
    let need = validate_plan(plan)?;
    let at_once = AtOnce {
        plan,
        need,
        objects,
    };
    Ok(match &plan.op {
        Op::Update { field, action } => {
            let keys = at_once.visit(KeysK::default())?.0;
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
            updated: at_once.visit(KeysK::default())?.0.len() as u64,
        },
        Op::UpdateRows { .. } | Op::RemoveRows { .. } => {
            return Err(
                "a typed update or removal reads rows by their schema: insitu-query evaluates it"
                    .into(),
            );
        }
        // Every other operation only reads (`read_op` says None to writes).
        read => read_op(read, at_once).ok_or("a write taken for a read")??,
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
