//! Any bytes as a plan (postcard) followed by values: the plan is checked
//! and evaluated over the values as a shard would; errors are fine.
#![no_main]

use insitu_compute::reference::evaluate;
use insitu_protocol::plan::ScanPlan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((plan, rest)) = postcard::take_from_bytes::<ScanPlan>(data) else {
        return;
    };
    // The rest: values separated by 0xff, each keyed by its first byte. A
    // plan with JSON paths reads them as documents (0xff never occurs in
    // UTF-8, so any JSON text can be one value).
    let objects: Vec<(&[u8], &[u8])> = rest
        .split(|&b| b == 0xff)
        .take(64)
        .map(|v| (&v[..v.len().min(1)], v))
        .collect();
    let _ = evaluate(&plan, &objects);
});
