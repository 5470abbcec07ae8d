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

    proptest! {
        #[test]
        fn runs_round_trip(sizes in proptest::collection::vec(0u64..4, 0..200)) {
            let r = runs(sizes.iter().copied());
            prop_assert_eq!(r.len(), run_count(&sizes));
            prop_assert!(r.windows(2).all(|w| w[0].0 != w[1].0));
            prop_assert_eq!(expand(&r, sizes.len()).unwrap(), sizes);
        }
    }
}
