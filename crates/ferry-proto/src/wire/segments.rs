//! The segments of a [`Lease`](super::Lease) as they travel: compact until
//! the lease is checked against the request it answers.

use crate::runs::Runs;

/// The `(address, length)` segments of a lease, kept as they travel: the
/// lengths as [`Runs`], the addresses either one per segment or as runs of
/// segments that each start where the one before ends. What it holds
/// follows the bytes received; the list of segments is built
/// ([`expand`](Self::expand)) only once the lease was found to match a
/// request of this side (its lengths are that request's sizes).
///
/// ```
/// use ferry_proto::wire::Segments;
/// let s = Segments::from(vec![(100, 4), (104, 4), (200, 8)]);
/// assert_eq!(s.len(), 3);
/// assert_eq!(s.lens().first_difference(&[4, 4, 8]), None);
/// assert_eq!(s.expand(), vec![(100, 4), (104, 4), (200, 8)]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments {
    lens: Runs,
    addrs: Addresses,
}

/// How the addresses of a lease travel (see [`Lease::segments`](super::Lease)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Addresses {
    /// One per segment.
    Each(Vec<u64>),
    /// `(first address, segments)`: segments that follow each other.
    Runs(Vec<(u64, u32)>),
}

impl Default for Addresses {
    fn default() -> Self {
        Addresses::Each(Vec::new())
    }
}

impl Segments {
    /// Segments as decoded: the caller checked that the addresses cover
    /// exactly `lens.len()` segments and do not overflow
    /// ([`run_ends_fit`]).
    pub(super) fn from_parts(lens: Runs, addrs: Addresses) -> Self {
        Segments { lens, addrs }
    }

    /// How many segments.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Their lengths.
    pub fn lens(&self) -> &Runs {
        &self.lens
    }

    pub(super) fn addrs(&self) -> &Addresses {
        &self.addrs
    }

    /// The segments, one by one.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        let lens = self.lens.iter();
        match &self.addrs {
            Addresses::Each(a) => Box::new(a.iter().copied().zip(lens)),
            Addresses::Runs(runs) => {
                // Whether each segment starts a run, and that run's address.
                let starts = runs
                    .iter()
                    .flat_map(|&(first, n)| (0..n).map(move |k| (first, k == 0)));
                Box::new(starts.zip(lens).scan(0u64, |at, ((first, new), len)| {
                    if new {
                        *at = first;
                    }
                    let here = *at;
                    // Checked while decoding (a run that overflows
                    // is refused); saturating for one built here.
                    *at = at.saturating_add(len);
                    Some((here, len))
                }))
            }
        }
    }

    /// The list of segments ([`len`](Self::len) of them). Only for a lease
    /// whose lengths were checked against sizes this side holds.
    pub fn expand(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(self.len());
        out.extend(self.iter());
        out
    }
}

impl From<&[(u64, u64)]> for Segments {
    /// The segments in the shorter of the two address forms.
    fn from(segments: &[(u64, u64)]) -> Self {
        let lens: Runs = segments.iter().map(|s| s.1).collect();
        let runs = address_runs(segments);
        let addrs = if 4 + runs.len() * 12 < segments.len() * 8 {
            Addresses::Runs(runs)
        } else {
            Addresses::Each(segments.iter().map(|s| s.0).collect())
        };
        Segments { lens, addrs }
    }
}

impl From<Vec<(u64, u64)>> for Segments {
    fn from(segments: Vec<(u64, u64)>) -> Self {
        Segments::from(&segments[..])
    }
}

/// The runs of `segments` that follow each other in memory: `(first
/// address, segments)`.
fn address_runs(segments: &[(u64, u64)]) -> Vec<(u64, u32)> {
    let mut out: Vec<(u64, u32)> = Vec::new();
    let mut next = None;
    for &(addr, len) in segments {
        match out.last_mut() {
            Some((_, n)) if next == Some(addr) && *n < u32::MAX => *n += 1,
            _ => out.push((addr, 1)),
        }
        next = addr.checked_add(len);
    }
    out
}

/// Whether address runs `addrs` cover exactly the segments of lengths
/// `lens`, and the address of each segment fits in 64 bits; in one step
/// per run of either list, never per segment.
pub(super) fn run_ends_fit(lens: &Runs, addrs: &[(u64, u32)]) -> Result<(), &'static str> {
    let mut lens = lens.as_runs().iter().copied().peekable();
    // Entries of the current run of lengths not yet walked.
    let mut left = lens.peek().map_or(0, |r| u64::from(r.1));
    // The sum of the lengths of the next `n` segments.
    let mut walk = |mut n: u64| -> Option<u128> {
        let mut sum = 0u128;
        while n > 0 {
            let &(size, _) = lens.peek()?;
            let k = n.min(left);
            sum += u128::from(size) * u128::from(k);
            n -= k;
            left -= k;
            if left == 0 {
                lens.next();
                left = lens.peek().map_or(0, |r| u64::from(r.1));
            }
        }
        Some(sum)
    };
    for &(first, n) in addrs {
        if n == 0 {
            return Err("address run count");
        }
        // The last segment's address: `first` plus the lengths before it.
        let before = walk(u64::from(n) - 1).ok_or("address run count")?;
        if u128::from(first) + before > u128::from(u64::MAX) {
            return Err("lease address");
        }
        walk(1).ok_or("address run count")?;
    }
    if walk(1).is_some() {
        // Segments left without an address.
        return Err("address run count");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_runs_are_checked_run_by_run() {
        let lens = Runs::new(vec![(8, 1 << 20)], 1 << 20).unwrap();
        assert_eq!(run_ends_fit(&lens, &[(0, 1 << 20)]), Ok(()));
        assert_eq!(run_ends_fit(&lens, &[(0, 1 << 19), (1, 1 << 19)]), Ok(()));
        assert_eq!(
            run_ends_fit(&lens, &[(0, 1 << 19)]),
            Err("address run count")
        );
        assert_eq!(
            run_ends_fit(&lens, &[(0, 1 << 20), (0, 1)]),
            Err("address run count")
        );
        assert_eq!(
            run_ends_fit(&lens, &[(u64::MAX - 8 * ((1 << 20) - 1), 1 << 20)]),
            Ok(())
        );
        assert_eq!(
            run_ends_fit(&lens, &[(u64::MAX - 8 * ((1 << 20) - 1) + 1, 1 << 20)]),
            Err("lease address")
        );
        // The last segment may end past the top; only addresses must fit.
        let one = Runs::new(vec![(u64::MAX, 1)], 1).unwrap();
        assert_eq!(run_ends_fit(&one, &[(u64::MAX, 1)]), Ok(()));
    }
}
