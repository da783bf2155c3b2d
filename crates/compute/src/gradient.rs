//! The logistic-regression gradient kernel: per point, a dot product, the
//! sigmoid and log-loss, and `(p - y) x` accumulated into the gradient. An
//! AVX2+FMA version is chosen at run time where the CPU has it.

use insitu_protocol::plan::GradPartial;

/// Lanes of the chunked accumulators: wide enough for the compiler to keep
/// several independent vector registers busy.
const LANES: usize = 32;

/// Points accumulated in f32 before the sums are flushed into f64, which
/// bounds rounding error whatever the number of points.
pub const FLUSH_POINTS: usize = 64;

/// Accumulates the gradient over points, one at a time, without allocating.
pub struct GradAcc {
    /// The model the gradient is taken at (one weight per dimension).
    pub weights: Vec<f32>,
    pub bias: f32,
    /// f32 running sums since the last flush (f32: twice the lanes per vector).
    local: Vec<f32>,
    /// f32 running bias-gradient sum since the last flush.
    local_bias: f32,
    /// Points since the last flush (flushed at `FLUSH_POINTS`).
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

    #[test]
    fn gradient_matches_a_direct_formula() {
        let dims = 37; // not a multiple of the lanes
        let n = 200;
        let mut rng = insitu_testkit::rng(1);
        let mut rnd = || rng.f32() * 2.0 - 1.0;
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
