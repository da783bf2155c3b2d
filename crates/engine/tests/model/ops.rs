//! The operations the model test generates, and their proptest strategies.

use insitu_engine::RejectRules;
use proptest::prelude::*;

use crate::{KEYS, MAX_VALUE, TABLES};

#[derive(Clone, Debug)]
pub struct Rules {
    flags: u8,
    /// given_version = current version + rel (clamped at 0).
    rel: i8,
}

impl Rules {
    /// Unconditional.
    pub fn none() -> Rules {
        Rules { flags: 0, rel: 0 }
    }

    pub fn make(&self, current: u64) -> RejectRules {
        RejectRules {
            exists: self.flags & 1 != 0,
            doesnt_exist: self.flags & 2 != 0,
            version_le_given: self.flags & 4 != 0,
            version_ne_given: self.flags & 8 != 0,
            given_version: (current as i64 + i64::from(self.rel)).max(0) as u64,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Op {
    Write {
        t: usize,
        k: u8,
        len: usize,
        fill: u8,
        rules: Rules,
    },
    Remove {
        t: usize,
        k: u8,
        rules: Rules,
    },
    IncI64 {
        t: usize,
        k: u8,
        delta: i64,
        rules: Rules,
    },
    IncF64 {
        t: usize,
        k: u8,
        delta: i16,
        rules: Rules,
    },
    Read {
        t: usize,
        k: u8,
    },
    Install {
        t: usize,
        k: u8,
        len: usize,
        higher: bool,
        d: u8,
    },
    RaiseVersion {
        which: usize,
        by: u8,
    },
    Clean,
    Split {
        t: usize,
        at: u64,
    },
    DropReplay {
        which: usize,
    },
    DropCreate {
        which: usize,
    },
    Scan {
        which: usize,
    },
    /// A write with a deadline `ttl_ms` after the model's clock (0: already due).
    WriteExpiring {
        t: usize,
        k: u8,
        len: usize,
        fill: u8,
        ttl_ms: u8,
        rules: Rules,
    },
    /// Move the engine's (pinned) clock on.
    Advance {
        ms: u8,
    },
    /// Ask for due objects and remove each, as a shard's sweep does.
    Sweep {
        max: u8,
    },
}

fn rules() -> impl Strategy<Value = Rules> {
    // Half the time unconditional, so most writes take effect.
    prop_oneof![
        1 => Just(Rules { flags: 0, rel: 0 }),
        1 => (0u8..16, -2i8..=2).prop_map(|(flags, rel)| Rules { flags, rel }),
    ]
}

fn value_len() -> impl Strategy<Value = usize> {
    prop_oneof![5 => 0usize..120, 4 => 120usize..=MAX_VALUE, 1 => Just(8usize), 1 => (MAX_VALUE + 1)..700usize]
}

pub fn op() -> impl Strategy<Value = Op> {
    let t = 0usize..TABLES.len();
    let k = 0u8..KEYS;
    prop_oneof![
        60 => (t.clone(), k.clone(), value_len(), any::<u8>(), rules()).prop_map(|(t, k, len, fill, rules)| Op::Write { t, k, len, fill, rules }),
        15 => (t.clone(), k.clone(), rules()).prop_map(|(t, k, rules)| Op::Remove { t, k, rules }),
        5 => (t.clone(), k.clone(), -1000i64..1000, rules()).prop_map(|(t, k, delta, rules)| Op::IncI64 { t, k, delta, rules }),
        4 => (t.clone(), k.clone(), any::<i16>(), rules()).prop_map(|(t, k, delta, rules)| Op::IncF64 { t, k, delta, rules }),
        8 => (t.clone(), k.clone()).prop_map(|(t, k)| Op::Read { t, k }),
        3 => (t.clone(), k.clone(), 0usize..200, any::<bool>(), 0u8..3).prop_map(|(t, k, len, higher, d)| Op::Install { t, k, len, higher, d }),
        1 => (any::<usize>(), 1u8..50).prop_map(|(which, by)| Op::RaiseVersion { which, by }),
        4 => Just(Op::Clean),
        1 => (t.clone(), any::<u64>()).prop_map(|(t, at)| Op::Split { t, at }),
        3 => any::<usize>().prop_map(|which| Op::DropReplay { which }),
        1 => any::<usize>().prop_map(|which| Op::DropCreate { which }),
        2 => any::<usize>().prop_map(|which| Op::Scan { which }),
        12 => (t.clone(), k.clone(), value_len(), any::<u8>(), any::<u8>(), rules()).prop_map(|(t, k, len, fill, ttl_ms, rules)| Op::WriteExpiring { t, k, len, fill, ttl_ms, rules }),
        6 => any::<u8>().prop_map(|ms| Op::Advance { ms }),
        3 => (1u8..40).prop_map(|max| Op::Sweep { max }),
    ]
}
