use std::fmt;

use serde::{Deserialize, Serialize};

/// The state of an operation, with the reference's six states and numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum OperationStatus {
    /// Not yet set up.
    Uninitialized = 0,
    /// Set up; no transfer has started.
    Initialized = 1,
    /// Bytes are moving.
    InProgress = 2,
    /// Every byte arrived and both sides know it. Terminal.
    Complete = 3,
    /// Cancelled by this side or by the remote. Terminal.
    Cancelled = 4,
    /// Failed; the error says why. Terminal.
    Errored = 5,
}

impl OperationStatus {
    /// Whether no further change can happen.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Cancelled | Self::Errored)
    }

    /// The reference's number for this state.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The state with the reference's number `n`, if any.
    pub const fn from_u8(n: u8) -> Option<Self> {
        Some(match n {
            0 => Self::Uninitialized,
            1 => Self::Initialized,
            2 => Self::InProgress,
            3 => Self::Complete,
            4 => Self::Cancelled,
            5 => Self::Errored,
            _ => return None,
        })
    }

    /// The reference's upper-case name, e.g. `IN_PROGRESS`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Uninitialized => "UNINITIALIZED",
            Self::Initialized => "INITIALIZED",
            Self::InProgress => "IN_PROGRESS",
            Self::Complete => "COMPLETE",
            Self::Cancelled => "CANCELLED",
            Self::Errored => "ERRORED",
        }
    }
}

impl fmt::Display for OperationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a passive operation allows its remote to do. The numbers are the
/// reference's: 1 READ (a readable operation), 2 WRITE (a writable one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum OperationKind {
    /// The remote may read the memory (a `ReadableOperation`).
    Read = 1,
    /// The remote may write the memory (a `WritableOperation`).
    Write = 2,
}

impl OperationKind {
    /// The wire and reference number.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The kind with number `n`, if any.
    pub const fn from_u8(n: u8) -> Option<Self> {
        match n {
            1 => Some(Self::Read),
            2 => Some(Self::Write),
            _ => None,
        }
    }

    /// The name of the passive operation that grants this kind.
    pub const fn passive_name(self) -> &'static str {
        match self {
            Self::Read => "ReadableOperation",
            Self::Write => "WritableOperation",
        }
    }

    /// The name of the active operation that uses this kind.
    pub const fn active_name(self) -> &'static str {
        match self {
            Self::Read => "ReadOperation",
            Self::Write => "WriteOperation",
        }
    }
}

impl fmt::Display for OperationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "READ",
            Self::Write => "WRITE",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_the_reference() {
        for n in 0..=5u8 {
            assert_eq!(OperationStatus::from_u8(n).unwrap().as_u8(), n);
        }
        assert_eq!(OperationStatus::from_u8(6), None);
        assert_eq!(OperationStatus::InProgress.to_string(), "IN_PROGRESS");
        assert_eq!(OperationKind::Read.as_u8(), 1);
        assert_eq!(OperationKind::Write.as_u8(), 2);
        assert!(OperationStatus::Errored.is_terminal());
        assert!(!OperationStatus::InProgress.is_terminal());
    }
}
