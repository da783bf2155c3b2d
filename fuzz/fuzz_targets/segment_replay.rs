//! Any bytes as a tablet's log segments into replay (what a recovery reads
//! from backups' disks): corrupt entries are reported, never loaded, never a
//! panic; whatever loads leaves the engine consistent. The input is tried
//! as one segment and as two (cut where its first byte says).
#![no_main]

use insitu_engine::{Engine, EngineConfig, HashRange};
use libfuzzer_sys::fuzz_target;

const TABLE: u64 = 3;

fn replay(segments: &[&[u8]]) {
    let config = EngineConfig {
        segment_bytes: 64 * 1024,
        memory_budget_bytes: 64 << 20,
        max_value_bytes: 4096,
    };
    let Ok(mut e) = Engine::with_max_key_bytes(config, 256) else {
        return;
    };
    if let Ok(report) = e.replay(TABLE, HashRange::FULL, segments.iter().copied()) {
        let stats = e.tablet_stats(TABLE, 0).expect("the replayed tablet exists");
        assert_eq!(stats.object_count, report.objects_loaded);
        e.check_invariants();
    }
}

fuzz_target!(|data: &[u8]| {
    replay(&[data]);
    if let Some(&first) = data.first() {
        let cut = (usize::from(first) * data.len() / 256).min(data.len());
        replay(&[&data[..cut], &data[cut..]]);
    }
});
