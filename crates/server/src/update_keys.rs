//! An update's list of matched keys, charged to the shard's memory budget
//! as it grows, so an update of a large tablet on a full budget is refused
//! before it writes anything instead of growing the process past its budget.

use std::cell::RefCell;

use insitu_compute::kernel::Kernel;
use insitu_engine::{Engine, TransientCharge};

/// Bytes collected between two charges. Why 256 KiB: the list outruns its
/// charge by at most this, and a charge (an atomic add and a budget check)
/// every few thousand keys costs nothing beside the scan that finds them.
const CHARGE_STEP_BYTES: u64 = 256 * 1024;

/// Bytes a collected key costs beside its own: its end offset.
const PER_KEY_BYTES: u64 = 8;

/// The update's key-collection kernel.
pub struct ChargedKeys<'e> {
    /// The matched keys, in scan order, back to back. Why one buffer and not
    /// a `Vec` per key: 8 bytes of bookkeeping per key instead of 24 plus an
    /// allocation's overhead, and ending the update frees two buffers, not
    /// one allocation per key with no yield in between.
    bytes: Vec<u8>,
    /// End offset in `bytes` of each key.
    ends: Vec<usize>,
    /// The shard's engine, whose budget is charged.
    engine: &'e RefCell<Engine>,
    /// What the list holds of the budget; released when the update ends.
    charges: Vec<TransientCharge>,
    /// Bytes collected since the last charge.
    uncharged: u64,
    /// Set when a charge is refused: the list stops growing (and is emptied),
    /// and the update must be refused.
    pub refused: bool,
}

impl<'e> ChargedKeys<'e> {
    pub fn new(engine: &'e RefCell<Engine>) -> ChargedKeys<'e> {
        ChargedKeys {
            bytes: Vec::new(),
            ends: Vec::new(),
            engine,
            charges: Vec::new(),
            uncharged: 0,
            refused: false,
        }
    }

    /// Keys collected.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The keys, in scan order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter())
            .map(|(s, &e)| &self.bytes[s..e])
    }

    /// Bytes charged so far.
    pub fn charged_bytes(&self) -> u64 {
        self.charges.iter().map(|c| c.bytes()).sum()
    }

    /// Charge what was collected since the last step; after this the whole
    /// list is charged (or `refused` is set).
    pub fn settle(&mut self) {
        self.charge();
    }

    fn charge(&mut self) {
        if self.uncharged == 0 || self.refused {
            return;
        }
        match self.engine.borrow().try_charge_transient(self.uncharged) {
            Ok(c) => {
                self.charges.push(c);
                self.uncharged = 0;
            }
            Err(_) => {
                self.refused = true;
                // Give the memory back at once; the update is refused anyway.
                self.bytes = Vec::new();
                self.ends = Vec::new();
            }
        }
    }
}

impl Kernel for ChargedKeys<'_> {
    fn visit(&mut self, key: &[u8], _: &[u8]) {
        if self.refused {
            return;
        }
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
        self.uncharged += key.len() as u64 + PER_KEY_BYTES;
        if self.uncharged >= CHARGE_STEP_BYTES {
            self.charge();
        }
    }
    fn reset(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.charges.clear();
        self.uncharged = 0;
        self.refused = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_engine::EngineConfig;

    fn engine(budget_bytes: usize) -> RefCell<Engine> {
        let config = EngineConfig {
            memory_budget_bytes: budget_bytes,
            ..EngineConfig::default()
        };
        RefCell::new(Engine::new(config).expect("engine"))
    }

    #[test]
    fn the_list_is_charged_and_released() {
        let e = engine(64 << 20);
        let mut k = ChargedKeys::new(&e);
        for i in 0..10_000u32 {
            k.visit(&i.to_le_bytes(), b"");
        }
        k.settle();
        assert!(!k.refused);
        assert_eq!(k.len(), 10_000);
        let back: Vec<u32> = k
            .iter()
            .map(|key| u32::from_le_bytes(key.try_into().unwrap()))
            .collect();
        assert_eq!(
            back,
            (0..10_000).collect::<Vec<u32>>(),
            "every key, in order"
        );
        assert_eq!(k.charged_bytes(), 10_000 * (4 + PER_KEY_BYTES));
        assert_eq!(e.borrow().memory().transient_bytes, k.charged_bytes());
        drop(k);
        assert_eq!(e.borrow().memory().transient_bytes, 0);
    }

    #[test]
    fn a_list_larger_than_the_budget_is_refused_and_emptied() {
        let e = engine(16 << 20);
        let mut k = ChargedKeys::new(&e);
        let key = vec![7u8; 1000];
        for _ in 0..100_000 {
            k.visit(&key, b"");
        }
        k.settle();
        assert!(k.refused);
        assert_eq!(k.len(), 0);
        // It never held more than the budget plus one step beyond its charge.
        assert!(k.charged_bytes() <= 16 << 20);
        assert!(
            k.charged_bytes() > 0,
            "it was charged until the budget said no"
        );
        k.reset();
        assert_eq!(e.borrow().memory().transient_bytes, 0);
    }
}
