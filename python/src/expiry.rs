//! Deadlines from Python: `ttl=` (seconds from now) or `expires_at=` (Unix
//! seconds), as floats, to the wire's Unix milliseconds.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The deadline in Unix ms for `put(.., ttl=, expires_at=)`: 0 for neither.
/// Refused: both at once, a non-positive or non-finite `ttl`, an
/// `expires_at` that is not a positive finite number, or one beyond what
/// milliseconds in 64 bits hold.
pub fn deadline_ms(ttl: Option<f64>, expires_at: Option<f64>) -> PyResult<u64> {
    let at_s = match (ttl, expires_at) {
        (None, None) => return Ok(0),
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err("give ttl or expires_at, not both"));
        }
        (Some(t), None) => {
            if !(t.is_finite() && t > 0.0) {
                return Err(PyValueError::new_err(format!(
                    "ttl must be a positive number of seconds, not {t}"
                )));
            }
            now_s() + t
        }
        (None, Some(at)) => {
            if !(at.is_finite() && at > 0.0) {
                return Err(PyValueError::new_err(format!(
                    "expires_at must be a positive Unix time in seconds, not {at}"
                )));
            }
            at
        }
    };
    let ms = (at_s * 1000.0).ceil();
    // u64::MAX as f64 rounds up, so compare below it.
    if ms >= u64::MAX as f64 {
        return Err(PyValueError::new_err(
            "the deadline is too far in the future",
        ));
    }
    Ok((ms as u64).max(1))
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
