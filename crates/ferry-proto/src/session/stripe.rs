//! The rules of a striped transfer that span its connections: which parts
//! are bound, and how many have been confirmed. Each part travels as a
//! request of its own (see [`Session`](super::Session)); part 0 commits the
//! whole only once every other part is confirmed.

pub use crate::wire::part_range;
use crate::wire::MAX_PARTS;

/// A striped transfer's state, shared by its parts' requests (the driver
/// keeps it behind a lock of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeState {
    parts: u16,
    /// Bit `i`: part `i` is bound to a request.
    bound: u32,
    /// Parts other than 0 whose bytes have all landed.
    done: u16,
}

/// Why a part cannot join a stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// The part number is outside the stripe.
    #[error("part {part} of a transfer in {parts} parts")]
    OutOfRange {
        /// The part.
        part: u16,
        /// The stripe's parts.
        parts: u16,
    },
    /// Another request carries this part already.
    #[error("part {0} bound twice")]
    BoundTwice(u16),
}

impl StripeState {
    /// A transfer in `parts` parts (2 to [`MAX_PARTS`]; clamped).
    pub fn new(parts: u16) -> Self {
        StripeState {
            parts: parts.clamp(1, MAX_PARTS),
            bound: 0,
            done: 0,
        }
    }

    /// How many parts.
    pub fn parts(&self) -> u16 {
        self.parts
    }

    /// Records that a request carries `part`; each part once.
    pub fn bind(&mut self, part: u16) -> Result<(), BindError> {
        if part >= self.parts {
            return Err(BindError::OutOfRange {
                part,
                parts: self.parts,
            });
        }
        let bit = 1u32 << part;
        if self.bound & bit != 0 {
            return Err(BindError::BoundTwice(part));
        }
        self.bound |= bit;
        Ok(())
    }

    /// Part other than 0 has landed (destination) or been confirmed
    /// (source). Each part's request reports it once (see
    /// [`Action::PartDone`](super::Action::PartDone)).
    pub fn part_done(&mut self) {
        self.done = (self.done + 1).min(self.parts.saturating_sub(1));
    }

    /// How many parts other than 0 are done.
    pub fn done(&self) -> u16 {
        self.done
    }

    /// Every part other than 0 is done: part 0 may commit.
    pub fn can_commit(&self) -> bool {
        self.done + 1 >= self.parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_binds_once_and_part_zero_commits_last() {
        let mut s = StripeState::new(3);
        assert_eq!(s.bind(1), Ok(()));
        assert_eq!(s.bind(1), Err(BindError::BoundTwice(1)));
        assert_eq!(s.bind(3), Err(BindError::OutOfRange { part: 3, parts: 3 }));
        assert!(s.bind(0).is_ok() && s.bind(2).is_ok());
        assert!(!s.can_commit());
        s.part_done();
        assert!(!s.can_commit());
        s.part_done();
        assert!(s.can_commit());
        s.part_done();
        assert_eq!(s.done(), 2);
    }

    #[test]
    fn parts_cover_every_byte_once() {
        for total in [0u64, 1, 7, 4096, 1 << 33] {
            for parts in 1..=MAX_PARTS {
                let mut at = 0;
                for p in 0..parts {
                    let (a, b) = part_range(total, p, parts);
                    assert_eq!(a, at);
                    assert!(b >= a);
                    at = b;
                }
                assert_eq!(at, total);
            }
        }
    }
}
