//! Scan plans: the declarative description of a data operation that a client
//! sends to every tablet of a table (never code), their partial results, and
//! the evaluation primitives both ends share (field reads, the predicate
//! interpreter, the logistic-regression kernel).
//!
//! A plan is `source -> optional key range -> optional predicate -> one op`.
//!
//! Values of a raw table are read as fields at byte offsets, little-endian:
//! `i32@N`, `i64@N`, `f64@N`, `u8@N` (a label byte) and an f32 vector of `D`
//! dimensions at an offset. A value too short for a field is an error of the
//! whole request (`Status::BadRequest`, naming the key), never a silent skip.
//!
//! The predicate is a postfix program (`Vec<PredOp>`) instead of a tree, so
//! decoding hostile input never recurses and evaluation uses a fixed stack;
//! [`validate`] checks it before use.
//!
//! Integer keys (the `hashtable-lookup` source and the benchmarks): the
//! integer `i` is stored under the 8-byte little-endian key `i.to_le_bytes()`
//! (see [`int_key`]).

use serde::{Deserialize, Serialize};

use crate::message::Number;

/// Most operations a predicate program may have.
pub const MAX_PRED_OPS: usize = 256;
/// Deepest evaluation stack a predicate may need.
pub const MAX_PRED_DEPTH: usize = 32;
/// Largest vector dimension a gradient plan accepts.
pub const MAX_DIMS: u32 = 65_536;
/// Largest key-range bound, in bytes.
pub const MAX_RANGE_KEY_BYTES: usize = 64 * 1024;

/// The key under which the integer `i` is stored: 8 bytes, little-endian.
#[inline]
pub fn int_key(i: u64) -> [u8; 8] {
    i.to_le_bytes()
}

/// A scalar field of a raw value.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    I32(u32),
    I64(u32),
    F64(u32),
    /// One unsigned byte (a label).
    U8(u32),
}

impl Field {
    pub fn offset(self) -> usize {
        match self {
            Field::I32(o) | Field::I64(o) | Field::F64(o) | Field::U8(o) => o as usize,
        }
    }
    pub fn width(self) -> usize {
        match self {
            Field::I32(_) => 4,
            Field::I64(_) | Field::F64(_) => 8,
            Field::U8(_) => 1,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, Field::F64(_))
    }
    /// Bytes a value needs to hold this field.
    pub fn end(self) -> usize {
        self.offset() + self.width()
    }
    /// Read the field; `None` if the value is too short.
    #[inline(always)]
    pub fn read(self, value: &[u8]) -> Option<Number> {
        let o = self.offset();
        Some(match self {
            Field::I32(_) => {
                Number::I64(i32::from_le_bytes(value.get(o..o + 4)?.try_into().ok()?) as i64)
            }
            Field::I64(_) => Number::I64(i64::from_le_bytes(value.get(o..o + 8)?.try_into().ok()?)),
            Field::F64(_) => Number::F64(f64::from_le_bytes(value.get(o..o + 8)?.try_into().ok()?)),
            Field::U8(_) => Number::I64(*value.get(o)? as i64),
        })
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::I32(o) => write!(f, "i32@{o}"),
            Field::I64(o) => write!(f, "i64@{o}"),
            Field::F64(o) => write!(f, "f64@{o}"),
            Field::U8(o) => write!(f, "u8@{o}"),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// One step of a postfix predicate program.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum PredOp {
    /// Push `field OP value`.
    Cmp {
        field: Field,
        op: CmpOp,
        value: Number,
    },
    /// Push `lo <= field <= hi`.
    Between {
        field: Field,
        lo: Number,
        hi: Number,
    },
    /// Pop two, push their conjunction.
    And,
    /// Pop two, push their disjunction.
    Or,
    /// Pop one, push its negation.
    Not,
}

/// Where the objects of a tablet come from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Walk the tablet's log segments (the fast default).
    Log,
    /// Iterate the tablet's hash index.
    Index,
    /// Look up the integer keys `from..to` (see [`int_key`]) in the tablet's
    /// index; keys that hash outside the tablet are skipped.
    IntKeys { from: u64, to: u64 },
}

/// Keys `start <= key < end` (bytewise); `end: None` = no upper bound.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
}

impl KeyRange {
    #[inline]
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= &self.start[..] && self.end.as_deref().is_none_or(|e| key < e)
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub enum UpdateAction {
    Add(Number),
    Set(Number),
}

/// Points of a logistic regression: an f32 vector and a 0/1 label byte.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointLayout {
    /// Byte offset of the vector.
    pub offset: u32,
    pub dims: u32,
    /// Byte offset of the label (0 = negative, anything else = positive).
    pub label_offset: u32,
}

impl PointLayout {
    /// Bytes a value needs.
    pub fn end(&self) -> usize {
        (self.offset as usize + self.dims as usize * 4).max(self.label_offset as usize + 1)
    }
}

/// What to compute over the matched objects.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Op {
    Count,
    /// count, sum, min and max of a numeric field (avg = sum / count, client-side).
    Aggregate {
        field: Field,
    },
    /// Change a numeric field of every matched object; each change is a new
    /// version written through the log.
    Update {
        field: Field,
        action: UpdateAction,
    },
    /// Logistic-regression gradient and log-loss sums at `weights`, `bias`.
    Gradient {
        layout: PointLayout,
        weights: Vec<f32>,
        bias: f32,
    },
}

/// A declarative plan for one tablet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScanPlan {
    pub source: Source,
    pub key_range: Option<KeyRange>,
    /// Postfix predicate; empty = every object.
    pub filter: Vec<PredOp>,
    pub op: Op,
}

impl ScanPlan {
    pub fn new(op: Op) -> ScanPlan {
        ScanPlan {
            source: Source::Log,
            key_range: None,
            filter: Vec::new(),
            op,
        }
    }
}

/// count/sum/min/max of one field over one tablet. Integer fields sum in
/// `sum_int` (exact), float fields in `sum_float`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct AggPartial {
    pub count: u64,
    pub sum_int: i128,
    pub sum_float: f64,
    pub min: Option<Number>,
    pub max: Option<Number>,
}

impl AggPartial {
    #[inline(always)]
    pub fn add(&mut self, n: Number) {
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

    pub fn merge(&mut self, o: &AggPartial) {
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

    /// The sum as a number of the field's kind (integers saturate at i64).
    pub fn sum(&self, float: bool) -> Number {
        if float {
            Number::F64(self.sum_float)
        } else {
            Number::I64(self.sum_int.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
        }
    }

    pub fn avg(&self, float: bool) -> Option<f64> {
        (self.count > 0).then(|| {
            let s = if float {
                self.sum_float
            } else {
                self.sum_int as f64
            };
            s / self.count as f64
        })
    }
}

/// Gradient sums over one tablet's points: `grad[j] = sum (p - y) x_j`,
/// `bias = sum (p - y)`, `loss = sum -[y ln p + (1-y) ln(1-p)]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GradPartial {
    pub count: u64,
    pub grad: Vec<f64>,
    pub bias: f64,
    pub loss: f64,
}

impl GradPartial {
    pub fn zero(dims: usize) -> GradPartial {
        GradPartial {
            count: 0,
            grad: vec![0.0; dims],
            bias: 0.0,
            loss: 0.0,
        }
    }
    pub fn merge(&mut self, o: &GradPartial) {
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

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Partial {
    Count(u64),
    Aggregate(AggPartial),
    Update { updated: u64 },
    Gradient(GradPartial),
}

/// One tablet's answer to a scan plan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScanResult {
    /// Objects visited (matched or not).
    pub visited: u64,
    /// Objects that passed the key range and the predicate.
    pub matched: u64,
    /// Server time spent on the scan itself, in nanoseconds.
    pub server_nanos: u64,
    /// Times the scan restarted because the tablet changed between chunks.
    pub restarts: u32,
    pub partial: Partial,
}

// ---- evaluation -------------------------------------------------------------

#[inline(always)]
fn num_lt(a: Number, b: Number) -> bool {
    match (a, b) {
        (Number::I64(x), Number::I64(y)) => x < y,
        (x, y) => as_f64(x) < as_f64(y),
    }
}

#[inline(always)]
pub fn as_f64(n: Number) -> f64 {
    match n {
        Number::I64(v) => v as f64,
        Number::F64(v) => v,
    }
}

#[inline(always)]
fn compare(a: Number, op: CmpOp, b: Number) -> bool {
    let ord = match (a, b) {
        (Number::I64(x), Number::I64(y)) => x.partial_cmp(&y),
        (x, y) => as_f64(x).partial_cmp(&as_f64(y)),
    };
    let Some(ord) = ord else {
        return op == CmpOp::Ne; // NaN: only "not equal" holds
    };
    use std::cmp::Ordering::*;
    match op {
        CmpOp::Eq => ord == Equal,
        CmpOp::Ne => ord != Equal,
        CmpOp::Lt => ord == Less,
        CmpOp::Le => ord != Greater,
        CmpOp::Gt => ord == Greater,
        CmpOp::Ge => ord != Less,
    }
}

/// Check a predicate program: stack discipline, bounded size and depth.
/// Returns the largest value end offset it reads (0 if none).
pub fn validate(program: &[PredOp]) -> Result<usize, String> {
    if program.len() > MAX_PRED_OPS {
        return Err(format!(
            "predicate has {} operations, more than {MAX_PRED_OPS}",
            program.len()
        ));
    }
    let mut depth = 0usize;
    let mut need = 0usize;
    for (i, op) in program.iter().enumerate() {
        match op {
            PredOp::Cmp { field, .. } | PredOp::Between { field, .. } => {
                depth += 1;
                need = need.max(field.end());
                if depth > MAX_PRED_DEPTH {
                    return Err(format!("predicate nests deeper than {MAX_PRED_DEPTH}"));
                }
            }
            PredOp::And | PredOp::Or => {
                if depth < 2 {
                    return Err(format!("predicate op {i} needs two operands"));
                }
                depth -= 1;
            }
            PredOp::Not => {
                if depth < 1 {
                    return Err(format!("predicate op {i} needs an operand"));
                }
            }
        }
    }
    if !program.is_empty() && depth != 1 {
        return Err(format!("predicate leaves {depth} values, not one"));
    }
    Ok(need)
}

/// Evaluate a validated predicate on a value. `Err(field)` if the value is
/// too short for a field the predicate reads. An empty program is true.
#[inline]
pub fn eval(program: &[PredOp], value: &[u8]) -> Result<bool, Field> {
    let mut stack = [false; MAX_PRED_DEPTH];
    let mut sp = 0usize;
    for op in program {
        match *op {
            PredOp::Cmp {
                field,
                op,
                value: c,
            } => {
                let v = field.read(value).ok_or(field)?;
                stack[sp] = compare(v, op, c);
                sp += 1;
            }
            PredOp::Between { field, lo, hi } => {
                let v = field.read(value).ok_or(field)?;
                stack[sp] = compare(v, CmpOp::Ge, lo) && compare(v, CmpOp::Le, hi);
                sp += 1;
            }
            PredOp::And => {
                sp -= 1;
                stack[sp - 1] = stack[sp - 1] && stack[sp];
            }
            PredOp::Or => {
                sp -= 1;
                stack[sp - 1] = stack[sp - 1] || stack[sp];
            }
            PredOp::Not => stack[sp - 1] = !stack[sp - 1],
        }
    }
    Ok(sp == 0 || stack[0])
}

/// Apply an update to the field's bytes in `value` (already checked long enough).
pub fn apply_update(field: Field, action: UpdateAction, value: &mut [u8]) {
    let o = field.offset();
    let current = field.read(value).expect("value checked long enough");
    let new = match action {
        UpdateAction::Set(n) => n,
        UpdateAction::Add(d) => match (current, d) {
            (Number::I64(a), Number::I64(b)) => Number::I64(a.wrapping_add(b)),
            (a, b) => Number::F64(as_f64(a) + as_f64(b)),
        },
    };
    match field {
        Field::I32(_) => {
            let v = match new {
                Number::I64(v) => v as i32,
                Number::F64(v) => v as i32,
            };
            value[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
        Field::I64(_) => {
            let v = match new {
                Number::I64(v) => v,
                Number::F64(v) => v as i64,
            };
            value[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        Field::F64(_) => value[o..o + 8].copy_from_slice(&as_f64(new).to_le_bytes()),
        Field::U8(_) => {
            value[o] = match new {
                Number::I64(v) => v as u8,
                Number::F64(v) => v as u8,
            }
        }
    }
}

// ---- logistic regression kernel ---------------------------------------------

/// Lanes of the chunked accumulators: wide enough for the compiler to keep
/// several independent vector registers busy.
const LANES: usize = 32;

/// Points accumulated in f32 before the sums are flushed into f64, which
/// bounds rounding error whatever the number of points.
pub const FLUSH_POINTS: usize = 64;

/// Accumulates the gradient over points, one at a time, without allocating.
pub struct GradAcc {
    pub weights: Vec<f32>,
    pub bias: f32,
    /// f32 running sums since the last flush.
    local: Vec<f32>,
    local_bias: f32,
    local_n: usize,
    /// AVX2 + FMA available (checked once).
    fast: bool,
    pub out: GradPartial,
}

impl GradAcc {
    pub fn new(weights: Vec<f32>, bias: f32) -> GradAcc {
        let d = weights.len();
        GradAcc {
            weights,
            bias,
            local: vec![0.0; d],
            local_bias: 0.0,
            local_n: 0,
            fast: detect_fast(),
            out: GradPartial::zero(d),
        }
    }

    /// Add one point: `x` holds `dims * 4` bytes of little-endian f32.
    #[inline]
    pub fn add_point_bytes(&mut self, x: &[u8], positive: bool) {
        #[cfg(target_arch = "x86_64")]
        {
            if self.fast {
                // SAFETY: the CPU supports the features the function is compiled for.
                unsafe { point_avx2(self, x, positive) };
                return self.after_point();
            }
        }
        point_generic(self, x, positive);
        self.after_point()
    }

    #[inline(always)]
    fn after_point(&mut self) {
        self.local_n += 1;
        if self.local_n == FLUSH_POINTS {
            self.flush();
        }
    }

    fn flush(&mut self) {
        for (o, l) in self.out.grad.iter_mut().zip(self.local.iter_mut()) {
            *o += *l as f64;
            *l = 0.0;
        }
        self.out.bias += self.local_bias as f64;
        self.local_bias = 0.0;
        self.local_n = 0;
    }

    pub fn finish(mut self) -> GradPartial {
        self.flush();
        self.out
    }
}

fn detect_fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The per-point scalar work: sigmoid, error, log-loss; returns `p - y`.
#[inline(always)]
fn point_scalar(acc: &mut GradAcc, dot: f32, positive: bool) -> f32 {
    let z = dot + acc.bias;
    let y = if positive { 1.0f32 } else { 0.0 };
    // One exp and one ln_1p per point, numerically stable for any z:
    // e = exp(-|z|); p = 1/(1+e) for z >= 0, e/(1+e) for z < 0;
    // log-loss = log(1 + exp(z)) - y z = ln_1p(e) + max(z, 0) - y z.
    let e = (-z.abs()).exp();
    let inv = 1.0 / (1.0 + e);
    let p = if z >= 0.0 { inv } else { e * inv };
    let err = p - y;
    let loss = e.ln_1p() + z.max(0.0) - y * z;
    acc.out.loss += loss as f64;
    acc.out.count += 1;
    acc.local_bias += err;
    err
}

#[inline(always)]
fn point_body<const FMA: bool>(acc: &mut GradAcc, x: &[u8], positive: bool) {
    let d = acc.weights.len();
    let x = &x[..d * 4];
    // Dot product with LANES independent accumulators (vectorisable).
    let mut lanes = [0f32; LANES];
    let mut xc = x.chunks_exact(4 * LANES);
    let mut wc = acc.weights.chunks_exact(LANES);
    for (xb, wb) in (&mut xc).zip(&mut wc) {
        for l in 0..LANES {
            let xv = f32::from_le_bytes([xb[4 * l], xb[4 * l + 1], xb[4 * l + 2], xb[4 * l + 3]]);
            lanes[l] = madd::<FMA>(xv, wb[l], lanes[l]);
        }
    }
    let mut dot = 0f32;
    for (xb, w) in xc.remainder().chunks_exact(4).zip(wc.remainder()) {
        dot += f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]) * w;
    }
    // Pairwise (tree) reduction: a few vector adds, not LANES dependent scalar ones.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
    }
    dot += lanes[0];
    let err = point_scalar(acc, dot, positive);
    for (g, xb) in acc.local.iter_mut().zip(x.chunks_exact(4)) {
        let xv = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
        *g = madd::<FMA>(xv, err, *g);
    }
}

/// `a * b + c`: one fused instruction where FMA is enabled (only called so
/// from the AVX2+FMA path: elsewhere `mul_add` would be a slow library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

fn point_generic(acc: &mut GradAcc, x: &[u8], positive: bool) {
    point_body::<false>(acc, x, positive)
}

/// The AVX2+FMA kernel: the same arithmetic as `point_body`, written with
/// explicit 8-lane vectors (four independent accumulators for the dot product).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn point_avx2(acc: &mut GradAcc, x: &[u8], positive: bool) {
    use std::arch::x86_64::*;
    let d = acc.weights.len();
    assert!(x.len() >= d * 4 && acc.local.len() == d);
    // Little-endian f32 bytes are the native representation on x86_64; loads are unaligned.
    let xp = x.as_ptr() as *const f32;
    let wp = acc.weights.as_ptr();
    // SAFETY: every access below is at an index < d, checked above.
    unsafe {
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut a2 = _mm256_setzero_ps();
        let mut a3 = _mm256_setzero_ps();
        let mut j = 0;
        while j + 32 <= d {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(j)), _mm256_loadu_ps(wp.add(j)), a0);
            a1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(xp.add(j + 8)),
                _mm256_loadu_ps(wp.add(j + 8)),
                a1,
            );
            a2 = _mm256_fmadd_ps(
                _mm256_loadu_ps(xp.add(j + 16)),
                _mm256_loadu_ps(wp.add(j + 16)),
                a2,
            );
            a3 = _mm256_fmadd_ps(
                _mm256_loadu_ps(xp.add(j + 24)),
                _mm256_loadu_ps(wp.add(j + 24)),
                a3,
            );
            j += 32;
        }
        while j + 8 <= d {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(j)), _mm256_loadu_ps(wp.add(j)), a0);
            j += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        let mut dot = _mm_cvtss_f32(h);
        while j < d {
            dot = xp.add(j).read_unaligned().mul_add(*wp.add(j), dot);
            j += 1;
        }
        let err = point_scalar(acc, dot, positive);
        let e = _mm256_set1_ps(err);
        let lp = acc.local.as_mut_ptr();
        let mut j = 0;
        while j + 8 <= d {
            let g = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(j)), e, _mm256_loadu_ps(lp.add(j)));
            _mm256_storeu_ps(lp.add(j), g);
            j += 8;
        }
        while j < d {
            *lp.add(j) = xp.add(j).read_unaligned().mul_add(err, *lp.add(j));
            j += 1;
        }
    }
}

/// The same gradient over points given as f32 slices (the in-memory
/// reference and the flat-array baseline): bytes are reinterpreted, so the
/// arithmetic is identical to the pushdown kernel's.
pub fn gradient_flat(
    points: &[f32],
    labels: &[u8],
    dims: usize,
    weights: &[f32],
    bias: f32,
) -> GradPartial {
    let mut acc = GradAcc::new(weights.to_vec(), bias);
    for (i, &y) in labels.iter().enumerate() {
        let x = &points[i * dims..(i + 1) * dims];
        // SAFETY: f32 has no invalid bit patterns; the kernel reads LE bytes,
        // which on little-endian targets are the same bytes.
        let bytes = unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, dims * 4) };
        acc.add_point_bytes(bytes, y != 0);
    }
    acc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(a: i64, b: f64, c: i32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&a.to_le_bytes());
        v.extend_from_slice(&b.to_le_bytes());
        v.extend_from_slice(&c.to_le_bytes());
        v
    }

    #[test]
    fn fields_read_little_endian_and_report_short_values() {
        let v = value(-5, 2.5, 7);
        assert_eq!(Field::I64(0).read(&v), Some(Number::I64(-5)));
        assert_eq!(Field::F64(8).read(&v), Some(Number::F64(2.5)));
        assert_eq!(Field::I32(16).read(&v), Some(Number::I64(7)));
        assert_eq!(Field::U8(16).read(&v), Some(Number::I64(7)));
        assert_eq!(Field::I32(17).read(&v), None);
        assert_eq!(Field::I64(u32::MAX).read(&v), None);
    }

    #[test]
    fn predicate_programs_evaluate() {
        use PredOp::*;
        let v = value(10, 1.75, 3);
        let gt5 = Cmp {
            field: Field::I64(0),
            op: CmpOp::Gt,
            value: Number::I64(5),
        };
        let btw = Between {
            field: Field::F64(8),
            lo: Number::F64(1.5),
            hi: Number::I64(2),
        };
        let eq3 = Cmp {
            field: Field::I32(16),
            op: CmpOp::Eq,
            value: Number::I64(3),
        };
        // i64@0 > 5 and (f64@8 between 1.5 and 2 or not i32@16 = 3)
        let p = vec![gt5.clone(), btw.clone(), eq3.clone(), Not, Or, And];
        assert_eq!(validate(&p), Ok(20));
        assert_eq!(eval(&p, &v), Ok(true));
        assert_eq!(eval(&p, &value(10, 3.0, 3)), Ok(false));
        assert_eq!(eval(&p, &value(10, 3.0, 4)), Ok(true));
        assert_eq!(eval(&p, &value(5, 1.75, 3)), Ok(false));
        assert_eq!(eval(&[], &v), Ok(true));
        assert_eq!(eval(&p, &v[..12]), Err(Field::F64(8)));
        for bad in [
            vec![And],
            vec![gt5.clone(), Or],
            vec![gt5.clone(), eq3.clone()],
            vec![Not],
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
        let deep = vec![gt5; MAX_PRED_DEPTH + 1];
        assert!(validate(&deep).is_err());
    }

    #[test]
    fn comparisons_mix_ints_and_floats_and_nan() {
        assert!(compare(
            Number::I64(i64::MAX),
            CmpOp::Gt,
            Number::I64(i64::MAX - 1)
        ));
        assert!(compare(Number::I64(2), CmpOp::Lt, Number::F64(2.5)));
        assert!(!compare(
            Number::F64(f64::NAN),
            CmpOp::Eq,
            Number::F64(f64::NAN)
        ));
        assert!(compare(Number::F64(f64::NAN), CmpOp::Ne, Number::I64(1)));
    }

    #[test]
    fn plans_round_trip_through_postcard() {
        let plan = ScanPlan {
            source: Source::IntKeys { from: 3, to: 99 },
            key_range: Some(KeyRange {
                start: b"a".to_vec(),
                end: None,
            }),
            filter: vec![
                PredOp::Cmp {
                    field: Field::U8(4),
                    op: CmpOp::Ne,
                    value: Number::I64(0),
                },
                PredOp::Not,
            ],
            op: Op::Gradient {
                layout: PointLayout {
                    offset: 0,
                    dims: 2,
                    label_offset: 8,
                },
                weights: vec![0.5, -1.0],
                bias: 0.25,
            },
        };
        let bytes = postcard::to_stdvec(&plan).unwrap();
        let back: ScanPlan = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, plan);
        let r = ScanResult {
            visited: 5,
            matched: 2,
            server_nanos: 7,
            restarts: 0,
            partial: Partial::Aggregate(AggPartial {
                count: 2,
                sum_int: -3,
                sum_float: 0.0,
                min: Some(Number::I64(-4)),
                max: Some(Number::I64(1)),
            }),
        };
        let bytes = postcard::to_stdvec(&r).unwrap();
        assert_eq!(postcard::from_bytes::<ScanResult>(&bytes).unwrap(), r);
    }

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
    }

    #[test]
    fn updates_write_the_field() {
        let mut v = value(1, 2.0, 3);
        apply_update(Field::I64(0), UpdateAction::Add(Number::I64(5)), &mut v);
        apply_update(Field::F64(8), UpdateAction::Add(Number::F64(0.5)), &mut v);
        apply_update(Field::I32(16), UpdateAction::Set(Number::I64(-9)), &mut v);
        assert_eq!(v, value(6, 2.5, -9));
    }

    #[test]
    fn gradient_matches_a_direct_formula() {
        let dims = 37; // not a multiple of the lanes
        let n = 200;
        let mut s = 1u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2000) as f32 / 1000.0 - 1.0
        };
        let pts: Vec<f32> = (0..n * dims).map(|_| rnd()).collect();
        let labels: Vec<u8> = (0..n).map(|i| (i % 3 == 0) as u8).collect();
        let w: Vec<f32> = (0..dims).map(|_| rnd() * 0.1).collect();
        let g = gradient_flat(&pts, &labels, dims, &w, 0.1);
        let mut want = vec![0f64; dims];
        let (mut wb, mut wl) = (0f64, 0f64);
        for i in 0..n {
            let x = &pts[i * dims..(i + 1) * dims];
            let z: f64 = x
                .iter()
                .zip(&w)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
                + 0.1;
            let p = 1.0 / (1.0 + (-z).exp());
            let y = labels[i] as f64;
            for j in 0..dims {
                want[j] += (p - y) * x[j] as f64;
            }
            wb += p - y;
            wl += -(y * p.ln() + (1.0 - y) * (1.0 - p).ln());
        }
        assert_eq!(g.count, n as u64);
        #[allow(clippy::needless_range_loop)]
        for j in 0..dims {
            assert!(
                (g.grad[j] - want[j]).abs() < 1e-3,
                "{j}: {} vs {}",
                g.grad[j],
                want[j]
            );
        }
        assert!((g.bias - wb).abs() < 1e-3);
        assert!((g.loss - wl).abs() / wl < 1e-5);
    }
}
