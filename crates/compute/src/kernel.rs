//! The per-object work of a scan, monomorphised per operation and field
//! kind, behind the value-length check, the key range, the reading of the
//! plan's JSON paths (one pass per object, only when it has some) and the
//! predicate ([`Visit`]). The driver (which objects, in what chunks) is the
//! server's.

use insitu_protocol::plan::{KeyRange, PointLayout, PredOp, ScanPlan};

use crate::gradient::GradAcc;
use crate::json_doc::{JsonDoc, op_path};
use crate::predicate::{eval_with, key_in_range};

/// One operation's per-object work.
pub trait Kernel {
    /// Called for every object that passed the range, length and predicate
    /// checks; `value` is at least as long as the plan needs.
    fn visit(&mut self, key: &[u8], value: &[u8]);
    /// `visit`, when the plan reads JSON paths: `json` holds what they
    /// found in `value` (a kernel of a JSON path reads it there instead of
    /// reading the document again).
    #[inline(always)]
    fn visit_json(&mut self, key: &[u8], value: &[u8], json: &JsonDoc) {
        let _ = json;
        self.visit(key, value)
    }
    /// Forget everything visited (the scan restarts).
    fn reset(&mut self);
}

/// `count`.
#[derive(Default)]
pub struct CountK(pub u64);

impl Kernel for CountK {
    #[inline(always)]
    fn visit(&mut self, _: &[u8], _: &[u8]) {
        self.0 += 1;
    }
    fn reset(&mut self) {
        self.0 = 0;
    }
}

/// Update, phase one: the keys of the matched objects.
#[derive(Default)]
pub struct KeysK(pub Vec<Vec<u8>>);

impl Kernel for KeysK {
    fn visit(&mut self, key: &[u8], _: &[u8]) {
        self.0.push(key.to_vec());
    }
    fn reset(&mut self) {
        self.0.clear();
    }
}

/// The logistic-regression gradient over points of a fixed layout.
pub struct GradK {
    pub acc: GradAcc,
    /// Byte offset of the vector.
    pub off: usize,
    /// Bytes of the vector (`dims * 4`).
    pub bytes: usize,
    /// Byte offset of the label.
    pub label: usize,
}

impl GradK {
    /// The kernel of a plan's `Op::Gradient`: the server's scan and the
    /// reference evaluator build it the same way.
    pub fn new(layout: &PointLayout, weights: &[f32], bias: f32) -> GradK {
        GradK {
            acc: GradAcc::new(weights.to_vec(), bias),
            off: layout.offset as usize,
            bytes: layout.dims as usize * 4,
            label: layout.label_offset as usize,
        }
    }
}

impl Kernel for GradK {
    #[inline(always)]
    fn visit(&mut self, _: &[u8], value: &[u8]) {
        let x = &value[self.off..self.off + self.bytes];
        self.acc.add_point_bytes(x, value[self.label] != 0);
    }
    fn reset(&mut self) {
        self.acc = GradAcc::new(std::mem::take(&mut self.acc.weights), self.acc.bias);
    }
}

/// A kernel behind the value-length check and (when `FILTERED`) the key
/// range and predicate.
pub struct Visit<'p, K, const FILTERED: bool> {
    pub kernel: K,
    /// Bytes a value needs for everything the plan reads (see `validate_plan`).
    pub need: usize,
    key_range: Option<&'p KeyRange>,
    /// The validated predicate program.
    filter: &'p [PredOp],
    /// The plan's JSON paths (filter and operation), read once per object;
    /// empty when it reads none.
    json: JsonDoc,
    /// Objects offered, matched or not.
    pub visited: u64,
    /// Objects that passed the range and the predicate.
    pub matched: u64,
    /// The first object whose value was too short: (key, value length).
    pub short: Option<(Vec<u8>, usize)>,
}

impl<'p, K: Kernel, const FILTERED: bool> Visit<'p, K, FILTERED> {
    /// `plan` must have passed `validate_plan`, which returned `need`.
    pub fn new(kernel: K, need: usize, plan: &'p ScanPlan) -> Self {
        Visit {
            kernel,
            need,
            key_range: plan.key_range.as_ref(),
            filter: &plan.filter,
            // Validated: at most MAX_JSON_PATHS paths (else none is read,
            // and every JSON comparison is unknown).
            json: JsonDoc::for_plan(&plan.filter, op_path(&plan.op)).unwrap_or_default(),
            visited: 0,
            matched: 0,
            short: None,
        }
    }

    #[inline(always)]
    pub fn object(&mut self, key: &[u8], value: &[u8]) {
        self.visited += 1;
        if FILTERED
            && let Some(r) = self.key_range
            && !key_in_range(r, key)
        {
            return;
        }
        if value.len() < self.need {
            if self.short.is_none() {
                self.short = Some((key.to_vec(), value.len()));
            }
            return;
        }
        let json = !self.json.is_empty();
        if json {
            self.json.read(value);
        }
        if FILTERED {
            match eval_with(self.filter, value, &self.json) {
                Ok(true) => {}
                _ => return, // too short was ruled out above
            }
        }
        self.matched += 1;
        if json {
            self.kernel.visit_json(key, value, &self.json);
        } else {
            self.kernel.visit(key, value);
        }
    }

    pub fn reset(&mut self) {
        self.visited = 0;
        self.matched = 0;
        self.short = None;
        self.kernel.reset();
    }
}
