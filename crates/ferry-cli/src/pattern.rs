//! Deterministic byte patterns: both sides of a transfer can produce and
//! check the same bytes from a seed, without sending them another way.

fn mix(mut z: u64) -> u64 {
    // splitmix64's finalizer.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn word(seed: u64, desc: usize, i: usize) -> u64 {
    mix(seed ^ ((desc as u64) << 48) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Fills `buf` (descriptor number `desc`) with the pattern of `seed`.
pub fn fill(seed: u64, desc: usize, buf: &mut [u8]) {
    let mut chunks = buf.chunks_exact_mut(8);
    for (i, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&word(seed, desc, i).to_le_bytes());
    }
    let n = buf.len() / 8;
    let rest = buf.len() % 8;
    let last = word(seed, desc, n).to_le_bytes();
    buf[n * 8..].copy_from_slice(&last[..rest]);
}

/// A buffer of `size` bytes holding the pattern.
pub fn make(seed: u64, desc: usize, size: usize) -> Vec<u8> {
    let mut v = vec![0; size];
    fill(seed, desc, &mut v);
    v
}

/// The first byte offset where `buf` differs from the pattern, if any.
pub fn first_mismatch(seed: u64, desc: usize, buf: &[u8]) -> Option<usize> {
    let n = buf.len() / 8;
    for i in 0..n {
        let w = word(seed, desc, i).to_le_bytes();
        if buf[i * 8..i * 8 + 8] != w {
            let j = (0..8).find(|&j| buf[i * 8 + j] != w[j]).unwrap_or(0);
            return Some(i * 8 + j);
        }
    }
    let last = word(seed, desc, n).to_le_bytes();
    (n * 8..buf.len()).find(|&k| buf[k] != last[k - n * 8])
}

/// A 64-bit checksum of `buf` (not cryptographic; for detecting changes).
pub fn checksum(buf: &[u8]) -> u64 {
    let mut h = 0x6a09_e667_f3bc_c908u64 ^ buf.len() as u64;
    let mut chunks = buf.chunks_exact(8);
    for c in &mut chunks {
        h = (h.rotate_left(23) ^ u64::from_le_bytes(c.try_into().unwrap()))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    for &b in chunks.remainder() {
        h = (h.rotate_left(23) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_checks_every_byte() {
        for size in [0, 1, 7, 8, 9, 1000] {
            let mut v = make(3, 1, size);
            assert_eq!(first_mismatch(3, 1, &v), None);
            if size > 0 {
                assert_ne!(first_mismatch(4, 1, &v), None, "other seed");
                assert_ne!(first_mismatch(3, 2, &v), None, "other descriptor");
                let k = size - 1;
                v[k] ^= 1;
                assert_eq!(first_mismatch(3, 1, &v), Some(k));
            }
        }
        assert_ne!(checksum(&[0; 16]), checksum(&[0; 17]));
    }
}
