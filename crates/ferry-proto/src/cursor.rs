/// Checks that the payload of one transfer covers exactly the described
/// bytes, descriptor by descriptor, in order, with no gap, overlap or excess.
///
/// Both sides keep one: the sender asks it where the next chunk goes, the
/// receiver checks each incoming `Data` header against it before a single
/// payload byte touches memory. A chunk starts where the transfer stands
/// and may run on past the end of its descriptor into the ones that follow
/// (the descriptors' bytes taken as one flat sequence, in order): one
/// `Data` frame then carries many small blocks.
///
/// ```
/// use ferry_proto::Cursor;
/// let mut c = Cursor::new(vec![3, 0, 2]);
/// assert_eq!(c.next_chunk(2), Some((0, 0, 2)));
/// c.accept(0, 0, 2).unwrap();
/// assert_eq!(c.next_chunk(100), Some((0, 2, 1)));
/// c.accept(0, 2, 1).unwrap();
/// assert_eq!(c.next_chunk(100), Some((2, 0, 2)));
/// assert!(c.accept(2, 1, 1).is_err()); // a gap
/// c.accept(2, 0, 2).unwrap();
/// assert!(c.is_done());
/// ```
#[derive(Debug, Clone)]
pub struct Cursor {
    sizes: Vec<u64>,
    desc: usize,
    offset: u64,
    /// Bytes (flat, across descriptors) still to come.
    left: u64,
}

/// A chunk that does not continue the transfer where it stands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unexpected data for descriptor {desc} at offset {offset} (+{len} bytes); expected {expected}"
)]
pub struct CursorError {
    /// Descriptor index received.
    pub desc: u32,
    /// Offset received.
    pub offset: u64,
    /// Length received.
    pub len: u32,
    /// What was expected, in words.
    pub expected: String,
}

impl Cursor {
    /// A cursor at the start of descriptors of these sizes.
    pub fn new(sizes: Vec<u64>) -> Self {
        Self::range(sizes, 0, u64::MAX)
    }

    /// A cursor over the flat byte range `[start, end)` of descriptors of
    /// these sizes (one part of a striped transfer): bytes outside it are
    /// refused. A range past the end is cut to the end.
    ///
    /// ```
    /// use ferry_proto::Cursor;
    /// let mut c = Cursor::range(vec![4, 4], 3, 6);
    /// assert_eq!(c.next_chunk(100), Some((0, 3, 1)));
    /// c.accept(0, 3, 1).unwrap();
    /// assert_eq!(c.next_chunk(100), Some((1, 0, 2)));
    /// assert!(c.accept(1, 0, 3).is_err()); // past the range
    /// c.accept(1, 0, 2).unwrap();
    /// assert!(c.is_done());
    /// ```
    pub fn range(sizes: Vec<u64>, start: u64, end: u64) -> Self {
        let (mut desc, mut skip) = (0, start);
        while desc < sizes.len() && skip >= sizes[desc] {
            skip -= sizes[desc];
            desc += 1;
        }
        let total = sizes.iter().fold(0u64, |a, &s| a.saturating_add(s));
        let mut c = Cursor {
            sizes,
            desc,
            offset: skip,
            left: end.min(total).saturating_sub(start),
        };
        // Also ends an empty range.
        c.skip_full();
        c
    }

    fn skip_full(&mut self) {
        while self.desc < self.sizes.len() && self.offset == self.sizes[self.desc] {
            self.desc += 1;
            self.offset = 0;
        }
        if self.left == 0 {
            self.desc = self.sizes.len();
        }
    }

    /// The descriptors' sizes.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// Whether every byte has been accounted for.
    pub fn is_done(&self) -> bool {
        self.desc >= self.sizes.len()
    }

    /// Where the next chunk of at most `max` bytes (max > 0) within one
    /// descriptor goes: `(descriptor, offset, length)`; `None` when done.
    pub fn next_chunk(&self, max: u32) -> Option<(u32, u64, u32)> {
        if self.left == 0 {
            return None;
        }
        let size = *self.sizes.get(self.desc)?;
        let len = (size - self.offset).min(self.left).min(u64::from(max)) as u32;
        Some((self.desc as u32, self.offset, len))
    }

    /// Where the next chunk of at most `max` bytes (max > 0) goes, running
    /// on into the descriptors that follow: `(descriptor, offset, length)`
    /// of its start; `None` when done.
    ///
    /// ```
    /// use ferry_proto::Cursor;
    /// let mut c = Cursor::new(vec![3, 0, 2, 4]);
    /// assert_eq!(c.next_span(100), Some((0, 0, 9)));
    /// assert_eq!(c.next_span(4), Some((0, 0, 4)));
    /// c.accept(0, 0, 4).unwrap();
    /// assert_eq!(c.next_span(100), Some((2, 1, 5)));
    /// c.accept(2, 1, 5).unwrap();
    /// assert!(c.is_done());
    /// ```
    pub fn next_span(&self, max: u32) -> Option<(u32, u64, u32)> {
        if self.left == 0 || self.desc >= self.sizes.len() {
            return None;
        }
        let len = self.left.min(u64::from(max)) as u32;
        Some((self.desc as u32, self.offset, len))
    }

    /// Checks that a chunk continues the transfer exactly (it starts where
    /// the transfer stands and ends at most where it ends, possibly in a
    /// later descriptor), and advances.
    pub fn accept(&mut self, desc: u32, offset: u64, len: u32) -> Result<(), CursorError> {
        let err = |expected: String| CursorError {
            desc,
            offset,
            len,
            expected,
        };
        if self.desc >= self.sizes.len() {
            return Err(err("no more data".into()));
        }
        if desc as usize != self.desc
            || offset != self.offset
            || len == 0
            || u64::from(len) > self.left
        {
            return Err(err(format!(
                "descriptor {} at offset {} with 1..={} bytes",
                self.desc, self.offset, self.left
            )));
        }
        // Walks the descriptors it covers: at most `len` bytes' worth of
        // non-empty ones, and `left` guarantees they exist.
        let mut rest = u64::from(len);
        while rest > 0 {
            let Some(&size) = self.sizes.get(self.desc) else {
                break;
            };
            let room = size - self.offset;
            if rest < room {
                self.offset += rest;
                break;
            }
            rest -= room;
            self.offset = size;
            self.skip_full_keep_left();
        }
        self.left -= u64::from(len);
        self.skip_full();
        Ok(())
    }

    /// Steps over full (and empty) descriptors, without ending the cursor.
    fn skip_full_keep_left(&mut self) {
        while self.desc < self.sizes.len() && self.offset == self.sizes[self.desc] {
            self.desc += 1;
            self.offset = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunks_from_next_chunk_are_accepted_and_cover_everything(
            sizes in proptest::collection::vec(0u64..5000, 1..20), max in 1u32..3000) {
            let mut send = Cursor::new(sizes.clone());
            let mut recv = Cursor::new(sizes.clone());
            let mut total = 0u64;
            while let Some((d, o, l)) = send.next_chunk(max) {
                send.accept(d, o, l).unwrap();
                recv.accept(d, o, l).unwrap();
                total += u64::from(l);
            }
            prop_assert!(recv.is_done());
            prop_assert_eq!(total, sizes.iter().sum::<u64>());
        }

        #[test]
        fn arbitrary_chunks_never_panic_and_never_exceed(
            sizes in proptest::collection::vec(0u64..100, 1..5),
            chunks in proptest::collection::vec((0u32..6, any::<u64>(), any::<u32>()), 0..20)) {
            let mut c = Cursor::new(sizes.clone());
            let mut accepted = 0u64;
            for (d, o, l) in chunks {
                // Where the chunk starts in the flat sequence, if it is a
                // position at all.
                let at = (d as usize) < sizes.len() && o < sizes[d as usize];
                let flat = sizes[..(d as usize).min(sizes.len())].iter().sum::<u64>();
                if c.accept(d, o, l).is_ok() {
                    prop_assert!(at);
                    prop_assert_eq!(flat + o, accepted, "starts where the last ended");
                    accepted += u64::from(l);
                }
            }
            prop_assert!(accepted <= sizes.iter().sum::<u64>());
        }
    }

    proptest! {
        #[test]
        fn parts_of_a_transfer_are_accepted_exactly(
            sizes in proptest::collection::vec(0u64..5000, 1..20), parts in 1u16..8, max in 1u32..3000) {
            let total: u64 = sizes.iter().sum();
            let mut seen = 0u64;
            for p in 0..parts {
                let (start, end) = crate::wire::part_range(total, p, parts);
                let mut send = Cursor::range(sizes.clone(), start, end);
                let mut recv = Cursor::range(sizes.clone(), start, end);
                let mut flat = start;
                while let Some((d, o, l)) = send.next_chunk(max) {
                    // The chunk lies at the flat position the part expects.
                    let at: u64 = sizes[..d as usize].iter().sum::<u64>() + o;
                    prop_assert_eq!(at, flat);
                    send.accept(d, o, l).unwrap();
                    recv.accept(d, o, l).unwrap();
                    flat += u64::from(l);
                }
                prop_assert!(recv.is_done());
                prop_assert_eq!(flat, end);
                seen += end - start;
                // Nothing more fits, not even the next part's first byte.
                prop_assert!(recv.accept(0, 0, 1).is_err());
            }
            prop_assert_eq!(seen, total);
        }
    }

    proptest! {
        #[test]
        fn spans_across_descriptors_are_accepted_and_cover_everything(
            sizes in proptest::collection::vec(0u64..5000, 1..20), max in 1u32..30000,
            start in 0u64..40000, len in 0u64..40000) {
            let total: u64 = sizes.iter().sum();
            let (start, end) = (start.min(total), start.saturating_add(len).min(total));
            let mut send = Cursor::range(sizes.clone(), start, end);
            let mut recv = Cursor::range(sizes.clone(), start, end);
            let mut flat = start;
            while let Some((d, o, l)) = send.next_span(max) {
                let at: u64 = sizes[..d as usize].iter().sum::<u64>() + o;
                prop_assert_eq!(at, flat);
                prop_assert!(o < sizes[d as usize], "a span starts inside its descriptor");
                send.accept(d, o, l).unwrap();
                recv.accept(d, o, l).unwrap();
                flat += u64::from(l);
            }
            prop_assert!(recv.is_done());
            prop_assert_eq!(flat, end);
            prop_assert!(recv.accept(0, 0, 1).is_err());
        }
    }

    #[test]
    fn a_span_may_not_run_past_the_transfer() {
        let mut c = Cursor::new(vec![4, 4]);
        assert!(c.accept(0, 0, 9).is_err());
        assert!(c.accept(0, 0, 8).is_ok());
        assert!(c.is_done());
        let mut c = Cursor::range(vec![4, 4, 4], 2, 7);
        assert!(c.accept(0, 2, 6).is_err(), "past the part");
        assert!(c.accept(0, 2, 5).is_ok());
        assert!(c.accept(1, 3, 1).is_err());
    }

    #[test]
    fn overflowing_offset_is_refused() {
        let mut c = Cursor::new(vec![10]);
        assert!(c.accept(0, u64::MAX, 2).is_err());
        assert!(c.accept(0, 0, 11).is_err());
        assert!(c.accept(1, 0, 1).is_err());
    }
}
