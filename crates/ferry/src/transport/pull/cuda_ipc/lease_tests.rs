//! The CUDA IPC lease codec: round trips, and hostile input refused with
//! a typed error (never a panic, never a large allocation).

use super::*;

/// The source device's UUID in the samples.
const DEV: [u8; 16] = [7; 16];

fn alloc(tag: u8, size: u64) -> Alloc {
    Alloc {
        handle: [tag; 64],
        size,
    }
}

/// A pool of 8 blocks of 100 bytes in one allocation, lent in order, then
/// a descriptor at offset 0 of an allocation of its own, then an empty one.
fn sample() -> (Vec<Alloc>, Vec<(u32, u64)>, Vec<u64>) {
    let allocs = vec![alloc(1, 4096), alloc(2, 1 << 20)];
    let mut at: Vec<(u32, u64)> = (0..8u64).map(|i| (0, 96 + i * 100)).collect();
    let mut lens = vec![100; 8];
    at.push((1, 0));
    lens.push(1 << 20);
    at.push((NO_ALLOC, 0));
    lens.push(0);
    (allocs, at, lens)
}

fn header(allocs: u32, runs: u32) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&allocs.to_le_bytes());
    b.extend_from_slice(&runs.to_le_bytes());
    b.extend_from_slice(&DEV);
    b
}

fn run(b: &mut Vec<u8>, alloc: u32, count: u32, off: u64) {
    b.extend_from_slice(&alloc.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b.extend_from_slice(&off.to_le_bytes());
}

fn with_alloc(mut b: Vec<u8>, a: Alloc) -> Vec<u8> {
    b.extend_from_slice(&a.handle);
    b.extend_from_slice(&a.size.to_le_bytes());
    b
}

#[test]
fn a_lease_round_trips_as_runs() {
    let (allocs, at, lens) = sample();
    let b = encode(DEV, &allocs, &at, &lens);
    assert!(b.starts_with(&MAGIC));
    // The pool's blocks are one run; then one run each.
    assert_eq!(b.len(), HEADER + 2 * ALLOC + 3 * RUN);
    let l = decode(&b, &lens).unwrap();
    assert_eq!(l.device, DEV);
    assert_eq!(l.allocs, allocs);
    assert_eq!(l.at, at);
    // Out of order in the allocation: a run each.
    let shuffled = vec![(0, 200), (0, 100), (0, 0)];
    let b = encode(DEV, &allocs[..1], &shuffled, &[100, 100, 100]);
    assert_eq!(b.len(), HEADER + ALLOC + 3 * RUN);
    assert_eq!(decode(&b, &[100, 100, 100]).unwrap().at, shuffled);
}

#[test]
fn cross_memory_attach_leases_are_not_ipc() {
    // The destination picks its lane from the lease's lane id; bytes of
    // another lane are a bad lease here.
    for other in [&b""[..], b"FCI", b"UCX keys"] {
        assert!(decode(other, &[1]).is_err());
    }
}

#[test]
fn every_truncation_is_refused() {
    let (allocs, at, lens) = sample();
    let b = encode(DEV, &allocs, &at, &lens);
    for n in 0..b.len() {
        let e = decode(&b[..n], &lens).unwrap_err();
        assert!(matches!(e, LeaseError::Truncated { .. }), "{n}: {e:?}");
        assert!(!e.to_string().is_empty());
    }
    let mut long = b.clone();
    long.push(0);
    assert!(matches!(
        decode(&long, &lens),
        Err(LeaseError::TrailingBytes { .. })
    ));
}

#[test]
fn unknown_magic_version_and_flags_are_refused() {
    let (allocs, at, lens) = sample();
    let b = encode(DEV, &allocs, &at, &lens);
    let mut m = b.clone();
    m[0] = b'X';
    assert_eq!(decode(&m, &lens), Err(LeaseError::UnknownMagic));
    assert_eq!(decode(b"XY", &lens), Err(LeaseError::UnknownMagic));
    let mut v = b.clone();
    v[4] = 1;
    let e = decode(&v, &lens).unwrap_err();
    assert_eq!(
        e,
        LeaseError::UnknownVersion {
            version: 1,
            flags: 0
        }
    );
    assert!(e.to_string().contains("upgrade"), "{e}");
    let mut fl = b;
    fl[6] = 1;
    assert!(matches!(
        decode(&fl, &lens),
        Err(LeaseError::UnknownVersion { flags: 1, .. })
    ));
}

#[test]
fn huge_counts_are_refused_before_anything_is_allocated() {
    let lens = [8u64; 4];
    for (a, r) in [
        (u32::MAX, 1),
        (1, u32::MAX),
        (5, 1),
        (1, 5),
        (u32::MAX, u32::MAX),
    ] {
        let e = decode(&header(a, r), &lens).unwrap_err();
        assert!(matches!(e, LeaseError::TooMany { .. }), "{a} {r}: {e:?}");
    }
    // Counts within the segments but no bytes behind them.
    let e = decode(&header(4, 4), &lens).unwrap_err();
    assert_eq!(
        e,
        LeaseError::Truncated {
            len: HEADER,
            need: (HEADER + 4 * ALLOC + 4 * RUN) as u64
        }
    );
}

#[test]
fn counts_that_do_not_match_the_segments_are_refused() {
    let a = alloc(1, 1000);
    // One run of 3 for a lease of 4 segments, and of 5.
    let mut b = with_alloc(header(1, 1), a);
    run(&mut b, 0, 3, 0);
    assert_eq!(
        decode(&b, &[8; 4]),
        Err(LeaseError::CountMismatch {
            covered: 3,
            segments: 4
        })
    );
    let mut b = with_alloc(header(1, 1), a);
    run(&mut b, 0, 5, 0);
    assert!(matches!(
        decode(&b, &[8; 4]),
        Err(LeaseError::CountMismatch { covered: 5, .. })
    ));
    // Runs of u32::MAX segments do not add up past the lease either.
    let mut b = with_alloc(header(1, 2), a);
    run(&mut b, 0, u32::MAX, 0);
    run(&mut b, 0, u32::MAX, 0);
    assert!(matches!(
        decode(&b, &[8, 8]),
        Err(LeaseError::CountMismatch { .. })
    ));
    // An empty run, an allocation that is not there.
    let mut b = with_alloc(header(1, 1), a);
    run(&mut b, 0, 0, 0);
    assert_eq!(decode(&b, &[8]), Err(LeaseError::BadRun { run: 0 }));
    let mut b = with_alloc(header(1, 1), a);
    run(&mut b, 1, 1, 0);
    assert_eq!(decode(&b, &[8]), Err(LeaseError::BadRun { run: 0 }));
    // An allocation no run uses.
    let mut b = with_alloc(with_alloc(header(2, 1), a), a);
    run(&mut b, 0, 2, 0);
    assert_eq!(
        decode(&b, &[8, 8]),
        Err(LeaseError::UnusedAllocation { alloc: 1 })
    );
}

#[test]
fn segments_past_their_allocation_are_refused() {
    let a = alloc(1, 100);
    for (off, lens) in [
        (1u64, vec![100u64]),
        (0, vec![60, 41]),
        (u64::MAX, vec![1]),
        (u64::MAX - 10, vec![5, 6]),
        (101, vec![0]),
    ] {
        let mut b = with_alloc(header(1, 1), a);
        run(&mut b, 0, lens.len() as u32, off);
        let e = decode(&b, &lens).unwrap_err();
        assert!(
            matches!(e, LeaseError::OutOfAllocation { .. }),
            "{off} {lens:?}: {e:?}"
        );
    }
    // Exactly to the end is fine.
    let mut b = with_alloc(header(1, 1), a);
    run(&mut b, 0, 2, 40);
    assert_eq!(decode(&b, &[50, 10]).unwrap().at, vec![(0, 40), (0, 90)]);
    // No allocation: empty segments only.
    let mut b = header(0, 1);
    run(&mut b, NO_ALLOC, 2, 0);
    assert!(decode(&b, &[0, 0]).is_ok());
    assert_eq!(
        decode(&b, &[0, 1]),
        Err(LeaseError::OutOfAllocation { segment: 1 })
    );
}

/// Arbitrary bytes, and every one-byte corruption of a valid lease, decode
/// to a lease or a typed error, never a panic; whatever decodes lies
/// inside its allocations.
#[test]
fn garbage_never_panics() {
    let (allocs, at, lens) = sample();
    let good = encode(DEV, &allocs, &at, &lens);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let check = |b: &[u8]| {
        if let Ok(l) = decode(b, &lens) {
            assert_eq!(l.at.len(), lens.len());
            for (&(a, off), &len) in l.at.iter().zip(&lens) {
                match l.allocs.get(a as usize) {
                    Some(x) => assert!(off + len <= x.size),
                    None => assert_eq!((a, len), (NO_ALLOC, 0)),
                }
            }
        }
    };
    for i in 0..good.len() {
        for _ in 0..8 {
            let mut b = good.clone();
            b[i] = next() as u8;
            check(&b);
        }
    }
    for _ in 0..2000 {
        let n = (next() % 400) as usize;
        let mut b: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        if next() % 2 == 0 && b.len() >= 8 {
            b[..4].copy_from_slice(&MAGIC);
            b[4..8].copy_from_slice(&[1, 0, 0, 0]);
        }
        check(&b);
    }
}
