//! The bytes of the end-to-end integrity check (`ferry_proto::session`'s
//! `digest.rs` has its rules over TCP): CRC-32 over a flat byte range of a
//! region's memory, in descriptor order, read under the region's lock a
//! piece at a time, and over a stream's chunks as they go out. The
//! same-process transport compares the two regions' digests itself
//! ([`differ`]).
#![forbid(unsafe_code)]

use crc32fast::Hasher;

use crate::region::Region;

/// At most this many bytes are read under the region's lock at once.
const PIECE: u64 = 4 << 20;

/// CRC-32 of the flat bytes `[start, end)` of `region` (cut to its end), in
/// descriptor order; `None` where they cannot be read: device memory (the
/// CPU never touches it), or a region that closed.
pub(crate) fn of_range(region: &Region, (start, end): (u64, u64)) -> Option<u32> {
    if !region.is_host() {
        return None;
    }
    let mut h = Hasher::new();
    let mut at = 0u64;
    for (seg, size) in region.sizes().enumerate() {
        let (lo, hi) = (start.max(at), end.min(at.saturating_add(size)));
        let mut off = lo.saturating_sub(at);
        while lo < hi && at + off < hi {
            let n = (hi - at - off).min(PIECE) as usize;
            region.read_at(seg, off, n, |b| h.update(b)).ok()?;
            off += n as u64;
        }
        at = at.saturating_add(size);
        if at >= end {
            break;
        }
    }
    Some(h.finalize())
}

/// Where the digests of `src` and `dst` (all of each) differ, both, in
/// words; `None` where they agree or one cannot be read (device memory:
/// not checked).
pub(crate) fn differ(src: &Region, dst: &Region) -> Option<String> {
    let all = (0, u64::MAX);
    match (of_range(src, all), of_range(dst, all)) {
        (Some(s), Some(d)) if s != d => Some(format!(
            "the source's memory digests to {s:08x}, what landed to {d:08x}"
        )),
        _ => None,
    }
}

/// A stream's digest, fed each chunk as it goes out.
#[derive(Default)]
pub(crate) struct Running(Hasher);

impl Running {
    /// Adds `len` bytes of `region` from `off` of segment `seg` on (into
    /// the segments that follow); false where they cannot be read.
    pub(crate) fn add(&mut self, region: &Region, seg: u32, off: u64, len: u32) -> bool {
        let (mut seg, mut off, mut left) = (seg as usize, off, len as usize);
        while left > 0 {
            let r = region.read_span(seg, off, left, |pieces| {
                pieces.iter().fold(0, |n, p| {
                    self.0.update(p);
                    n + p.len()
                })
            });
            match r {
                Ok(n) if n > 0 => {
                    left -= n;
                    (seg, off) = region.advance(seg, off, n);
                }
                _ => return false,
            }
        }
        true
    }

    /// Adds bytes the stream copied itself.
    pub(crate) fn update(&mut self, b: &[u8]) {
        self.0.update(b);
    }

    pub(crate) fn value(self) -> u32 {
        self.0.finalize()
    }
}

/// Tests: landed memory of exactly one of these sizes gets one bit flipped
/// after its copy, as a late write or a bad copy would (each test adds
/// sizes no other test moves, and takes them out).
#[cfg(test)]
pub(crate) static CORRUPT_LANDED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// Flips the top bit of the first byte of `region` if its size is in
/// [`CORRUPT_LANDED`].
#[cfg(test)]
pub(crate) fn corrupt_for_tests(region: &Region) {
    let size = region.sizes().sum::<u64>();
    if crate::sync::lock(&CORRUPT_LANDED).contains(&size) {
        let _ = region.write_at(0, 0, 1, |b| b[0] ^= 0x80);
    }
}
