//! Why an engine operation failed.

/// Why an operation failed. Every variant maps to a wire status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineError {
    /// No tablet of this engine covers the key's hash (the client's map is stale).
    UnknownTablet,
    /// The budget is spent even after cleaning.
    OutOfMemory,
    KeyTooLarge {
        len: usize,
        max: usize,
    },
    ValueTooLarge {
        len: usize,
        max: usize,
    },
    EmptyKey,
    /// A reject rule fired; `version` is the current version (0 if absent).
    ObjectExists {
        version: u64,
    },
    ObjectDoesntExist,
    WrongVersion {
        version: u64,
    },
    /// Increment on a value that is not 8 bytes.
    NotANumber {
        len: usize,
    },
    /// The tablet's version counter is spent: the next version would pass
    /// `MAX_VERSION`, or a given version (install, raise) lies beyond it.
    VersionExhausted {
        version: u64,
    },
    /// The tablet's head holds room promised to pending groups (a
    /// transaction's decision, `Engine::promise_head`): `held` bytes of it,
    /// and `asked` more do not fit within `max` beside them. Retry once
    /// the decisions are applied.
    HeadPromised {
        held: usize,
        asked: usize,
        max: usize,
    },
    /// create_tablet / split: the range overlaps an existing tablet, or is invalid.
    BadTablet(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::UnknownTablet => write!(f, "no tablet here covers this key"),
            EngineError::OutOfMemory => write!(
                f,
                "out of memory: the memory budget is full even after cleaning"
            ),
            EngineError::KeyTooLarge { len, max } => {
                write!(f, "key of {len} bytes exceeds the maximum of {max}")
            }
            EngineError::ValueTooLarge { len, max } => {
                write!(f, "value of {len} bytes exceeds the maximum of {max}")
            }
            EngineError::EmptyKey => write!(f, "empty key: keys must be at least one byte"),
            EngineError::ObjectExists { version } => write!(f, "object exists (version {version})"),
            EngineError::ObjectDoesntExist => write!(f, "object does not exist"),
            EngineError::WrongVersion { version } => {
                write!(f, "version check failed (current version {version})")
            }
            EngineError::NotANumber { len } => {
                write!(f, "value is {len} bytes, not an 8-byte number")
            }
            EngineError::VersionExhausted { version } => write!(
                f,
                "version {version} is beyond the maximum {}: the tablet's version counter is exhausted",
                crate::MAX_VERSION
            ),
            EngineError::HeadPromised { held, asked, max } => write!(
                f,
                "the tablet's log head holds {held} bytes for pending transaction decisions; {asked} more bytes do not fit beside them (at most {max}): retry once they are applied"
            ),
            EngineError::BadTablet(why) => write!(f, "bad tablet: {why}"),
        }
    }
}

impl std::error::Error for EngineError {}

/// Map any allocation failure to `OutOfMemory`.
pub(crate) fn oom<T>(_: T) -> EngineError {
    EngineError::OutOfMemory
}
