//! How an engine is sized, and the reject rules of conditional operations.

use crate::EngineError;

/// How an engine is sized.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Bytes per log segment. Every entry must fit in one segment, so this
    /// must exceed `max_value_bytes + MAX_KEY_BYTES + entry header`.
    pub segment_bytes: usize,
    /// Total bytes of segments this engine may hold (the memory budget).
    pub memory_budget_bytes: usize,
    /// Largest value accepted, in bytes.
    pub max_value_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            segment_bytes: 2 * 1024 * 1024,
            memory_budget_bytes: 1 << 30,
            max_value_bytes: 1024 * 1024,
        }
    }
}

/// Conditions under which a write / remove / increment is refused
/// (RAMCloud's reject rules). All false = unconditional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectRules {
    /// Refuse if the object exists.
    pub exists: bool,
    /// Refuse if the object does not exist.
    pub doesnt_exist: bool,
    /// Refuse if the object exists and its version <= `given_version`.
    pub version_le_given: bool,
    /// Refuse if the object exists and its version != `given_version`.
    pub version_ne_given: bool,
    pub given_version: u64,
}

/// RAMCloud's reject-rule check against the current version (`None` = absent).
pub(crate) fn check_rules(rules: &RejectRules, current: Option<u64>) -> Result<(), EngineError> {
    let Some(version) = current else {
        return if rules.doesnt_exist {
            Err(EngineError::ObjectDoesntExist)
        } else {
            Ok(())
        };
    };
    if rules.exists {
        return Err(EngineError::ObjectExists { version });
    }
    if rules.version_le_given && version <= rules.given_version {
        return Err(EngineError::WrongVersion { version });
    }
    if rules.version_ne_given && version != rules.given_version {
        return Err(EngineError::WrongVersion { version });
    }
    Ok(())
}
