//! Run-length encoding of descriptor sizes.
//!
//! A KV-cache transfer is thousands of blocks of one size. Metadata and the
//! wire describe such a list as runs of `(size, count)`, so that what
//! travels does not grow with the block count where the sizes repeat: 16,384
//! blocks of 32 KiB are one run. In memory the sizes stay a plain list
//! (eight bytes a block, no object per block).

/// The most runs one list of sizes may have on the wire and in metadata.
pub const MAX_RUNS: usize = 16_384;

/// `sizes` as runs of equal values, in order: `(size, count)`, each count
/// at least 1, no two neighbours with the same size.
///
/// ```
/// use ferry_proto::runs::{expand, runs};
/// let r = runs([4, 4, 4, 8, 4]);
/// assert_eq!(r, vec![(4, 3), (8, 1), (4, 1)]);
/// assert_eq!(expand(&r, 16).unwrap(), vec![4, 4, 4, 8, 4]);
/// ```
pub fn runs(sizes: impl IntoIterator<Item = u64>) -> Vec<(u64, u32)> {
    let mut out: Vec<(u64, u32)> = Vec::new();
    for s in sizes {
        match out.last_mut() {
            Some((size, count)) if *size == s && *count < u32::MAX => *count += 1,
            _ => out.push((s, 1)),
        }
    }
    out
}

/// How many runs `sizes` has, without building them.
pub fn run_count(sizes: &[u64]) -> usize {
    sizes.windows(2).filter(|w| w[0] != w[1]).count() + usize::from(!sizes.is_empty())
}

/// Why runs do not describe a valid list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RunsError {
    /// A run of zero entries.
    #[error("a run of zero entries")]
    EmptyRun,
    /// More entries in all than allowed.
    #[error("the runs add up to more than {max} entries")]
    TooMany {
        /// The limit.
        max: usize,
    },
}

/// The list that `runs` describe, refused (before anything is allocated)
/// if it would hold more than `max` entries or a run is empty.
pub fn expand(runs: &[(u64, u32)], max: usize) -> Result<Vec<u64>, RunsError> {
    let mut n = 0usize;
    for &(_, c) in runs {
        if c == 0 {
            return Err(RunsError::EmptyRun);
        }
        n = n.saturating_add(c as usize);
        if n > max {
            return Err(RunsError::TooMany { max });
        }
    }
    let mut out = Vec::with_capacity(n);
    for &(s, c) in runs {
        out.extend(std::iter::repeat(s).take(c as usize));
    }
    Ok(out)
}

/// A list of sizes kept as its runs `(size, count)`, as an `Open` or a
/// `Lease` carries it until it is checked against a grant: its memory
/// follows the runs (what was received), never the entries they describe.
/// The runs are kept as given (neighbours of one size are not merged), so
/// that a decoded list encodes to the bytes it came from.
///
/// ```
/// use ferry_proto::runs::Runs;
/// let r = Runs::new(vec![(4, 3), (8, 1)], 16).unwrap();
/// assert_eq!((r.len(), r.run_count(), r.total()), (4, 2, 20));
/// assert_eq!(r.first_difference(&[4, 4, 4, 8]), None);
/// assert_eq!(r.first_difference(&[4, 4, 5, 8]), Some(2));
/// assert_eq!(r.expand(), vec![4, 4, 4, 8]);
/// assert_eq!(Runs::from(vec![4, 4, 4, 8]), r);
/// assert_eq!([4, 4, 4, 8].into_iter().collect::<Runs>(), r);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runs {
    runs: Vec<(u64, u32)>,
    /// The entries they describe.
    len: usize,
}

impl Runs {
    /// Runs as received, refused if one is empty or they describe more
    /// than `max` entries in all (nothing is allocated beyond `runs`).
    pub fn new(runs: Vec<(u64, u32)>, max: usize) -> Result<Self, RunsError> {
        let mut len = 0usize;
        for &(_, c) in &runs {
            if c == 0 {
                return Err(RunsError::EmptyRun);
            }
            len = len.saturating_add(c as usize);
            if len > max {
                return Err(RunsError::TooMany { max });
            }
        }
        Ok(Runs { runs, len })
    }

    /// The runs of `sizes` (see [`runs`]).
    pub fn of(sizes: &[u64]) -> Self {
        Runs {
            runs: runs(sizes.iter().copied()),
            len: sizes.len(),
        }
    }

    /// How many entries the runs describe.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether they describe no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The runs, `(size, count)`, as given.
    pub fn as_runs(&self) -> &[(u64, u32)] {
        &self.runs
    }

    /// How many runs there are.
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// The sum of the entries (saturating), in one step per run.
    pub fn total(&self) -> u64 {
        let t = self
            .runs
            .iter()
            .fold(0u128, |a, &(s, c)| a + u128::from(s) * u128::from(c));
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    /// The entries, one by one, without building the list.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.runs
            .iter()
            .flat_map(|&(s, c)| std::iter::repeat(s).take(c as usize))
    }

    /// The index of the first entry where `sizes` differs from these runs
    /// (`sizes.len()` or [`len`](Self::len) where one is a prefix of the
    /// other); `None` where they describe the same list. Its cost follows
    /// the shorter of the two, never the counts the runs claim.
    pub fn first_difference(&self, sizes: &[u64]) -> Option<usize> {
        let mut at = 0usize;
        for &(s, c) in &self.runs {
            let end = at.saturating_add(c as usize);
            let Some(part) = sizes.get(at..end) else {
                let rest = &sizes[at.min(sizes.len())..];
                return Some(at + rest.iter().take_while(|&&x| x == s).count());
            };
            if let Some(i) = part.iter().position(|&x| x != s) {
                return Some(at + i);
            }
            at = end;
        }
        (at != sizes.len()).then_some(at)
    }

    /// The list itself: [`len`](Self::len) entries. Only for runs that
    /// were checked against a list this side holds (a grant).
    pub fn expand(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len);
        out.extend(self.iter());
        out
    }
}

impl FromIterator<u64> for Runs {
    /// The runs of the sizes, built as they come (no list of them).
    fn from_iter<I: IntoIterator<Item = u64>>(sizes: I) -> Self {
        let mut len = 0usize;
        let runs = runs(sizes.into_iter().inspect(|_| len += 1));
        Runs { runs, len }
    }
}

impl From<Vec<u64>> for Runs {
    fn from(sizes: Vec<u64>) -> Self {
        Runs::of(&sizes)
    }
}

impl From<&[u64]> for Runs {
    fn from(sizes: &[u64]) -> Self {
        Runs::of(sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn limits_are_checked_before_allocating() {
        assert_eq!(
            expand(&[(1, u32::MAX), (1, u32::MAX)], 1 << 20),
            Err(RunsError::TooMany { max: 1 << 20 })
        );
        assert_eq!(expand(&[(1, 0)], 10), Err(RunsError::EmptyRun));
        assert_eq!(expand(&[], 10), Ok(vec![]));
        assert_eq!(run_count(&[]), 0);
    }

    #[test]
    fn runs_keep_their_shape_and_compare_without_expanding() {
        let r = Runs::new(vec![(1, u32::MAX)], usize::MAX).unwrap();
        // Four billion entries, compared against a short list at the cost
        // of that list.
        assert_eq!(r.first_difference(&[1, 1, 2]), Some(2));
        assert_eq!(r.first_difference(&[1, 1]), Some(2));
        assert_eq!(r.total(), u64::from(u32::MAX));
        assert_eq!(
            Runs::new(vec![(1, 3), (1, 1)], 3),
            Err(RunsError::TooMany { max: 3 })
        );
        assert_eq!(Runs::new(vec![(1, 0)], 3), Err(RunsError::EmptyRun));
        let split = Runs::new(vec![(7, 1), (7, 2)], 3).unwrap();
        assert_eq!(split.run_count(), 2);
        assert_eq!(split.first_difference(&[7, 7, 7]), None);
        assert_eq!(split.first_difference(&[7, 7, 7, 7]), Some(3));
        assert_eq!(split.first_difference(&[]), Some(0));
        assert_eq!(Runs::default().first_difference(&[]), None);
        assert_eq!(Runs::new(vec![(u64::MAX, 2)], 2).unwrap().total(), u64::MAX);
    }

    proptest! {
        #[test]
        fn first_difference_is_the_lists_own(
            a in proptest::collection::vec(0u64..3, 0..40),
            b in proptest::collection::vec(0u64..3, 0..40),
        ) {
            let want = a.iter().zip(&b).position(|(x, y)| x != y)
                .or((a.len() != b.len()).then_some(a.len().min(b.len())));
            prop_assert_eq!(Runs::of(&a).first_difference(&b), want);
            prop_assert_eq!(Runs::of(&a).expand(), a);
        }

        #[test]
        fn runs_round_trip(sizes in proptest::collection::vec(0u64..4, 0..200)) {
            let r = runs(sizes.iter().copied());
            prop_assert_eq!(r.len(), run_count(&sizes));
            prop_assert!(r.windows(2).all(|w| w[0].0 != w[1].0));
            prop_assert_eq!(expand(&r, sizes.len()).unwrap(), sizes);
        }
    }
}
