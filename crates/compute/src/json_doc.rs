//! Reading the values a plan's JSON paths name out of one document.
//!
//! One pass per object for all the plan's paths (the operation's and the
//! filter's, each distinct path once), through serde_json's streaming
//! reader: members and elements no path leads into are skipped without
//! being built (serde_json skips them with a loop and a byte per level, no
//! recursion), so nothing is allocated per object but the text of a string
//! found, into a buffer kept from object to object. The walk recurses only
//! along the paths (at most `MAX_JSON_PATH_STEPS` levels). Work per object
//! is linear in the value's size (times the few paths a key is compared
//! with); hostile bytes end in an error of the reader, never a panic.
//!
//! What a document is: UTF-8 JSON text as serde_json reads it, surrounded
//! by whitespace at most. Anything else (a truncated document, trailing
//! bytes, invalid UTF-8 anywhere) has no value at any path. serde_json
//! refuses a number beyond f64's range (`1e400`) where it reads one, i.e.
//! at the end of a path: then too the document has no value at any path.
//! A member repeated in one object: the last one counts (as in JavaScript's
//! `JSON.parse`).
//!
//! Numbers: written without a fraction or an exponent and within i64, an
//! integer (`Number::I64`); any other number the f64 nearest to its text
//! (serde_json's rule, with its exact `float_roundtrip` reading: `1.0`,
//! `1e2`, `-0` and `18446744073709551615` are floats).

use insitu_protocol::Number;
use insitu_protocol::plan::{JsonPath, JsonStep, Op, PredOp};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Most distinct JSON paths one plan may read. Why 32: they are tracked as
/// the bits of a `u32` during the walk, and each key of an object on a
/// path is compared with each path still following it.
pub const MAX_JSON_PATHS: usize = 32;

/// What a path found in the last document read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum JsonValue<'a> {
    /// Not JSON, or no such member or element.
    Missing,
    Null,
    Bool(bool),
    Num(Number),
    Str(&'a str),
    /// An object or an array.
    Container,
}

/// A slot's value without its text (kept apart to reuse its buffer).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Kind {
    #[default]
    Missing,
    Null,
    Bool(bool),
    Num(Number),
    Str,
    Container,
}

/// What one path found.
#[derive(Clone, Debug, Default)]
struct Slot {
    kind: Kind,
    /// The string found, when `kind` is `Str`; its capacity is kept from
    /// document to document.
    text: String,
}

/// The distinct JSON paths of a plan and what each found in the last
/// document read.
#[derive(Clone, Debug, Default)]
pub struct JsonDoc {
    /// Distinct paths; the operation's first when it has one.
    paths: Vec<JsonPath>,
    /// For each op of the filter, the index of its path (`u16::MAX`: none).
    op_slots: Vec<u16>,
    /// Whether `paths[0]` is the operation's path (`Op::JsonAggregate`).
    has_op_path: bool,
    /// One per path.
    slots: Vec<Slot>,
}

/// The path an operation reads, if it reads one.
pub fn op_path(op: &Op) -> Option<&JsonPath> {
    match op {
        Op::JsonAggregate { path } => Some(path),
        _ => None,
    }
}

impl JsonDoc {
    /// The paths of `filter` (a validated predicate) and `op_path`; refused
    /// if there are more than `MAX_JSON_PATHS` distinct ones.
    pub fn for_plan(filter: &[PredOp], op_path: Option<&JsonPath>) -> Result<JsonDoc, String> {
        let mut doc = JsonDoc::default();
        if let Some(p) = op_path {
            doc.paths.push(p.clone());
            doc.has_op_path = true;
        }
        for op in filter {
            let slot = match op {
                PredOp::JsonCmp { path, .. } => match doc.paths.iter().position(|p| p == path) {
                    Some(i) => i,
                    None if doc.paths.len() == MAX_JSON_PATHS => {
                        return Err(format!(
                            "a plan reads at most {MAX_JSON_PATHS} different JSON paths"
                        ));
                    }
                    None => {
                        doc.paths.push(path.clone());
                        doc.paths.len() - 1
                    }
                },
                _ => usize::from(u16::MAX),
            };
            doc.op_slots.push(slot as u16);
        }
        doc.slots = vec![Slot::default(); doc.paths.len()];
        Ok(doc)
    }

    /// Whether the plan reads no JSON path (nothing to read per object).
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// The distinct paths, in slot order.
    pub fn paths(&self) -> &[JsonPath] {
        &self.paths
    }

    /// Read every path's value out of `doc` (the previous document's values
    /// are forgotten).
    pub fn read(&mut self, doc: &[u8]) {
        for s in &mut self.slots {
            s.kind = Kind::Missing;
        }
        if self.paths.is_empty() {
            return;
        }
        let Ok(text) = std::str::from_utf8(doc) else {
            return;
        };
        let mut de = serde_json::Deserializer::from_str(text);
        let walk = Walk {
            paths: &self.paths,
            slots: &mut self.slots,
            depth: 0,
            active: (u64::MAX >> (64 - self.paths.len())) as u32,
        };
        if walk.deserialize(&mut de).and_then(|()| de.end()).is_err() {
            for s in &mut self.slots {
                s.kind = Kind::Missing;
            }
        }
    }

    /// What path number `slot` found.
    pub fn get(&self, slot: usize) -> JsonValue<'_> {
        let Some(s) = self.slots.get(slot) else {
            return JsonValue::Missing;
        };
        match s.kind {
            Kind::Missing => JsonValue::Missing,
            Kind::Null => JsonValue::Null,
            Kind::Bool(b) => JsonValue::Bool(b),
            Kind::Num(n) => JsonValue::Num(n),
            Kind::Str => JsonValue::Str(&s.text),
            Kind::Container => JsonValue::Container,
        }
    }

    /// What the path of the filter's op number `op` found (`Missing` for an
    /// op that reads no path).
    #[inline]
    pub fn for_op(&self, op: usize) -> JsonValue<'_> {
        match self.op_slots.get(op) {
            Some(&s) => self.get(usize::from(s)),
            None => JsonValue::Missing,
        }
    }

    /// What the operation's path found.
    #[inline]
    pub fn op_value(&self) -> JsonValue<'_> {
        if self.has_op_path {
            self.get(0)
        } else {
            JsonValue::Missing
        }
    }
}

/// The indexes of the set bits of `m`, lowest first.
fn bits(mut m: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            i
        })
    })
}

/// One node of the document on the way of some paths.
struct Walk<'w> {
    /// Every path of the plan (bit i of `active` is `paths[i]`).
    paths: &'w [JsonPath],
    /// Where each path's value goes, one per path.
    slots: &'w mut [Slot],
    /// Steps taken from the root to this node.
    depth: usize,
    /// The paths whose first `depth` steps lead here (bit i = `paths[i]`).
    active: u32,
}

impl Walk<'_> {
    /// The active paths that end at this node.
    fn ending(&self) -> u32 {
        bits(self.active)
            .filter(|&i| self.paths[i].steps.len() == self.depth)
            .fold(0, |m, i| m | 1 << i)
    }

    fn found(&mut self, kind: Kind) {
        for i in bits(self.ending()) {
            self.slots[i].kind = kind;
        }
    }

    /// The active paths going on from this node whose next step is `step`.
    fn next(&self, going: u32, is: impl Fn(&JsonStep) -> bool) -> u32 {
        bits(going)
            .filter(|&i| is(&self.paths[i].steps[self.depth]))
            .fold(0, |m, i| m | 1 << i)
    }

    fn child(&mut self, active: u32) -> Walk<'_> {
        Walk {
            paths: self.paths,
            slots: &mut *self.slots,
            depth: self.depth + 1,
            active,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(mut self) -> Result<(), E> {
        self.found(Kind::Null);
        Ok(())
    }

    fn visit_bool<E>(mut self, v: bool) -> Result<(), E> {
        self.found(Kind::Bool(v));
        Ok(())
    }

    fn visit_i64<E>(mut self, v: i64) -> Result<(), E> {
        self.found(Kind::Num(Number::I64(v)));
        Ok(())
    }

    fn visit_u64<E>(mut self, v: u64) -> Result<(), E> {
        let n = i64::try_from(v).map_or(Number::F64(v as f64), Number::I64);
        self.found(Kind::Num(n));
        Ok(())
    }

    fn visit_f64<E>(mut self, v: f64) -> Result<(), E> {
        self.found(Kind::Num(Number::F64(v)));
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        for i in bits(self.ending()) {
            let s = &mut self.slots[i];
            s.kind = Kind::Str;
            s.text.clear();
            s.text.push_str(v);
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.found(Kind::Container);
        let going = self.active & !self.ending();
        loop {
            let key = KeyMatch { walk: &self, going };
            let Some(sub) = map.next_key_seed(key)? else {
                return Ok(());
            };
            if sub == 0 {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            // A repeated member: the last one counts, so forget the earlier.
            for i in bits(sub) {
                self.slots[i].kind = Kind::Missing;
            }
            map.next_value_seed(self.child(sub))?;
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.found(Kind::Container);
        let going = self.active & !self.ending();
        let mut index: u64 = 0;
        loop {
            let sub = self.next(
                going,
                |s| matches!(s, JsonStep::Index(i) if u64::from(*i) == index),
            );
            let more = if sub == 0 {
                seq.next_element::<IgnoredAny>()?.is_some()
            } else {
                seq.next_element_seed(self.child(sub))?.is_some()
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }
}

/// An object's member name: which of the `going` paths take it next.
struct KeyMatch<'k, 'w> {
    /// The object's node: its paths and depth.
    walk: &'k Walk<'w>,
    /// The paths that go on below the object (0: the name is not compared).
    going: u32,
}

impl<'de> DeserializeSeed<'de> for KeyMatch<'_, '_> {
    type Value = u32;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u32, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyMatch<'_, '_> {
    type Value = u32;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E>(self, k: &str) -> Result<u32, E> {
        if self.going == 0 {
            return Ok(0);
        }
        Ok(self
            .walk
            .next(self.going, |s| matches!(s, JsonStep::Key(key) if key == k)))
    }
}

#[cfg(test)]
#[path = "json_doc_tests.rs"]
mod tests;
