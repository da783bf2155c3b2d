//! count/sum/min/max partials: accumulation, merge, and the per-object
//! aggregate kernels.

use insitu_protocol::Number;
use insitu_protocol::plan::{AggPartial, GradPartial, Partial};

use crate::field::num_lt;
use crate::json_doc::{JsonDoc, JsonValue};
use crate::kernel::Kernel;

/// A sum as reported: integer sums are exact in i128 (at most 2^64 values
/// of at most 2^63 each cannot overflow it), so a sum beyond i64 is printed
/// as it is rather than saturated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sum {
    Int(i128),
    Float(f64),
}

impl std::fmt::Display for Sum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sum::Int(v) => write!(f, "{v}"),
            Sum::Float(v) => write!(f, "{v}"),
        }
    }
}

/// Accumulation on an [`AggPartial`] (a plain wire type).
pub trait AggExt {
    /// Count `n` and fold it into sum, min and max.
    fn add(&mut self, n: Number);
    /// The exact sum of an integer field (never saturated or wrapped), or
    /// the f64 sum of a float field.
    fn sum(&self, float: bool) -> Sum;
    /// sum / count; `None` over no objects.
    fn avg(&self, float: bool) -> Option<f64>;
    /// The sum of a JSON path, whose numbers may be integers (in `sum_int`)
    /// and floats (in `sum_float`): exact while the float part is zero
    /// (then it adds nothing), else their f64 sum.
    fn mixed_sum(&self) -> Sum;
    /// `mixed_sum` / count; `None` over no values.
    fn mixed_avg(&self) -> Option<f64>;
}

impl AggExt for AggPartial {
    #[inline(always)]
    fn add(&mut self, n: Number) {
        self.count += 1;
        match n {
            Number::I64(v) => self.sum_int += v as i128,
            Number::F64(v) => self.sum_float += v,
        }
        if self.min.is_none_or(|m| num_lt(n, m)) {
            self.min = Some(n);
        }
        if self.max.is_none_or(|m| num_lt(m, n)) {
            self.max = Some(n);
        }
    }

    fn sum(&self, float: bool) -> Sum {
        if float {
            Sum::Float(self.sum_float)
        } else {
            Sum::Int(self.sum_int)
        }
    }

    fn avg(&self, float: bool) -> Option<f64> {
        (self.count > 0).then(|| {
            let s = if float {
                self.sum_float
            } else {
                self.sum_int as f64
            };
            s / self.count as f64
        })
    }

    fn mixed_sum(&self) -> Sum {
        if self.sum_float == 0.0 {
            Sum::Int(self.sum_int)
        } else {
            Sum::Float(self.sum_int as f64 + self.sum_float)
        }
    }

    fn mixed_avg(&self) -> Option<f64> {
        (self.count > 0).then(|| (self.sum_int as f64 + self.sum_float) / self.count as f64)
    }
}

/// Merging two partial results of the same kind (from two tablets).
pub trait Merge {
    fn merge(&mut self, other: &Self);
}

impl Merge for AggPartial {
    fn merge(&mut self, o: &AggPartial) {
        self.count += o.count;
        self.sum_int += o.sum_int;
        self.sum_float += o.sum_float;
        if let Some(m) = o.min
            && self.min.is_none_or(|s| num_lt(m, s))
        {
            self.min = Some(m);
        }
        if let Some(m) = o.max
            && self.max.is_none_or(|s| num_lt(s, m))
        {
            self.max = Some(m);
        }
    }
}

impl Merge for GradPartial {
    fn merge(&mut self, o: &GradPartial) {
        self.count += o.count;
        if self.grad.len() < o.grad.len() {
            self.grad.resize(o.grad.len(), 0.0);
        }
        for (a, b) in self.grad.iter_mut().zip(&o.grad) {
            *a += b;
        }
        self.bias += o.bias;
        self.loss += o.loss;
    }
}

/// Fold one tablet's partial into the running result (`None` = nothing yet).
/// Errors if the two are of different kinds.
pub fn merge_partial(into: &mut Option<Partial>, p: Partial) -> Result<(), String> {
    let Some(acc) = into else {
        *into = Some(p);
        return Ok(());
    };
    match (acc, p) {
        (Partial::Count(a), Partial::Count(b)) => *a += b,
        (Partial::Aggregate(a), Partial::Aggregate(b)) => a.merge(&b),
        (Partial::Update { updated: a }, Partial::Update { updated: b }) => *a += b,
        (Partial::Gradient(a), Partial::Gradient(b)) => a.merge(&b),
        (a, b) => {
            return Err(format!(
                "partial results of different kinds: {a:?} and {b:?}"
            ));
        }
    }
    Ok(())
}

/// Integer sum/min/max of a `W`-byte field (1, 4 or 8) at a runtime offset.
pub struct IntAggK<const W: usize> {
    /// Byte offset of the field.
    off: usize,
    count: u64,
    /// Exact: 2^64 values of i64 cannot overflow an i128.
    sum: i128,
    min: i64,
    max: i64,
}

impl<const W: usize> IntAggK<W> {
    pub fn new(off: usize) -> Self {
        assert!(matches!(W, 1 | 4 | 8), "integer fields are 1, 4 or 8 bytes");
        IntAggK {
            off,
            count: 0,
            sum: 0,
            min: i64::MAX,
            max: i64::MIN,
        }
    }
    pub fn partial(&self) -> AggPartial {
        AggPartial {
            count: self.count,
            sum_int: self.sum,
            sum_float: 0.0,
            min: (self.count > 0).then_some(Number::I64(self.min)),
            max: (self.count > 0).then_some(Number::I64(self.max)),
        }
    }
}

impl<const W: usize> Kernel for IntAggK<W> {
    #[inline(always)]
    fn visit(&mut self, _: &[u8], value: &[u8]) {
        let b = &value[self.off..self.off + W];
        let v = match W {
            1 => b[0] as i64,
            4 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
            _ => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        };
        self.count += 1;
        self.sum += v as i128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
    fn reset(&mut self) {
        *self = Self::new(self.off);
    }
}

/// Float sum/min/max of an `f64` field at a byte offset.
pub struct F64AggK {
    /// Byte offset of the field.
    pub off: usize,
    pub out: AggPartial,
}

impl F64AggK {
    pub fn new(off: usize) -> Self {
        F64AggK {
            off,
            out: AggPartial::default(),
        }
    }
}

impl Kernel for F64AggK {
    #[inline(always)]
    fn visit(&mut self, _: &[u8], value: &[u8]) {
        let b = &value[self.off..self.off + 8];
        let v = f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        self.out.add(Number::F64(v));
    }
    fn reset(&mut self) {
        self.out = AggPartial::default();
    }
}

/// count/sum/min/max of the JSON numbers at the plan's path
/// (`Op::JsonAggregate`); other values are skipped.
pub struct JsonAggK {
    /// The path read when called without a `Visit`'s reading (`visit`).
    own: JsonDoc,
    pub out: AggPartial,
}

impl JsonAggK {
    pub fn new(path: &insitu_protocol::plan::JsonPath) -> Self {
        JsonAggK {
            own: JsonDoc::for_plan(&[], Some(path)).unwrap_or_default(),
            out: AggPartial::default(),
        }
    }

    #[inline(always)]
    fn add(&mut self, v: JsonValue<'_>) {
        if let JsonValue::Num(n) = v {
            self.out.add(n);
        }
    }
}

impl Kernel for JsonAggK {
    fn visit(&mut self, _: &[u8], value: &[u8]) {
        self.own.read(value);
        let v = self.own.op_value();
        if let JsonValue::Num(n) = v {
            self.out.add(n);
        }
    }
    #[inline(always)]
    fn visit_json(&mut self, _: &[u8], _: &[u8], json: &JsonDoc) {
        self.add(json.op_value());
    }
    fn reset(&mut self) {
        self.out = AggPartial::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_merge() {
        let mut a = AggPartial::default();
        a.add(Number::I64(3));
        a.add(Number::I64(-2));
        let mut b = AggPartial::default();
        b.add(Number::I64(10));
        a.merge(&b);
        a.merge(&AggPartial::default());
        assert_eq!(
            (a.count, a.sum_int, a.min, a.max),
            (3, 11, Some(Number::I64(-2)), Some(Number::I64(10)))
        );
        assert_eq!(a.avg(false), Some(11.0 / 3.0));
        assert_eq!(a.sum(false), Sum::Int(11));
    }

    #[test]
    fn integer_sums_are_exact_beyond_i64() {
        // Three i64::MAX on two tablets: merged in i128, printed exactly.
        let mut t1 = IntAggK::<8>::new(0);
        for _ in 0..2 {
            t1.visit(b"k", &i64::MAX.to_le_bytes());
        }
        let mut t2 = IntAggK::<8>::new(0);
        t2.visit(b"k", &i64::MAX.to_le_bytes());
        let mut a = t1.partial();
        a.merge(&t2.partial());
        assert_eq!(a.sum(false), Sum::Int(3 * i64::MAX as i128));
        assert_eq!(a.sum(false).to_string(), "27670116110564327421");
        let mut neg = AggPartial::default();
        for _ in 0..3 {
            neg.add(Number::I64(i64::MIN));
        }
        assert_eq!(neg.sum(false).to_string(), "-27670116110564327424");
    }

    #[test]
    fn int_kernel_matches_the_generic_accumulator() {
        let mut k = IntAggK::<4>::new(1);
        let mut want = AggPartial::default();
        for v in [5i32, -7, i32::MAX, i32::MIN] {
            let mut bytes = vec![0u8];
            bytes.extend_from_slice(&v.to_le_bytes());
            k.visit(b"k", &bytes);
            want.add(Number::I64(v as i64));
        }
        assert_eq!(k.partial(), want);
    }

    #[test]
    fn partials_of_different_kinds_do_not_merge() {
        let mut acc = None;
        merge_partial(&mut acc, Partial::Count(2)).unwrap();
        merge_partial(&mut acc, Partial::Count(3)).unwrap();
        assert_eq!(acc, Some(Partial::Count(5)));
        assert!(merge_partial(&mut acc, Partial::Update { updated: 1 }).is_err());
    }
}
