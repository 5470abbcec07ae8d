//! The fence's unit tests.
use super::*;

#[test]
fn bounds_and_close_are_enforced() {
    let descs = vec![
        Descriptor::from_vec(vec![0; 8]),
        Descriptor::from_vec(vec![0; 4]),
    ];
    // SAFETY: the descriptors outlive the region and are not touched elsewhere.
    let r = unsafe { Region::new(&descs, true) };
    assert_eq!(r.write_at(0, 4, 4, |s| s.fill(7)), Ok(()));
    assert_eq!(r.write_at(0, 5, 4, |_| ()), Err(Denied::OutOfBounds));
    assert_eq!(r.write_at(1, u64::MAX, 2, |_| ()), Err(Denied::OutOfBounds));
    assert_eq!(r.write_at(2, 0, 0, |_| ()), Err(Denied::OutOfBounds));
    assert_eq!(
        r.read_at(0, 0, 8, |s| s.to_vec()),
        Ok(vec![0, 0, 0, 0, 7, 7, 7, 7])
    );
    r.close();
    assert_eq!(r.read_at(0, 0, 1, |_| ()), Err(Denied::Closed));
    assert_eq!(r.write_at(0, 0, 1, |_| ()), Err(Denied::Closed));
    // SAFETY: as above.
    let ro = unsafe { Region::new(&descs, false) };
    assert_eq!(ro.write_at(0, 0, 1, |_| ()), Err(Denied::OutOfBounds));
    assert_eq!(ro.copy_into(0, 1, None, |_| ()), Err(Denied::OutOfBounds));
}

#[test]
fn lent_storage_lives_until_every_lease_is_given_back() {
    let descs = vec![
        Descriptor::from_vec(vec![0; 8]),
        Descriptor::from_vec(vec![0; 4]),
    ];
    // SAFETY: the descriptors outlive the region and are not touched elsewhere.
    let r = std::sync::Arc::new(unsafe { Region::new(&descs, true) });
    assert_eq!(r.copy_into(0, 2, None, |raw| raw.len()), Ok(2));
    assert_eq!(r.copy_into(1, 2, None, |_| ()), Err(Denied::OutOfBounds));
    assert_eq!(
        r.copy_into(0, 1, Some((4, 4)), |raw| raw[0].1),
        Ok(4),
        "a part of a segment"
    );
    assert_eq!(
        r.copy_into(0, 1, Some((6, 4)), |_| ()),
        Err(Denied::OutOfBounds)
    );
    // Not lent: the storage is handed back to be dropped at once.
    assert!(r.keep_while_used(Box::new(1u8)).is_some());
    r.lend();
    r.lend();
    let storage = std::sync::Arc::new(());
    assert!(r.keep_while_used(Box::new(storage.clone())).is_none());
    assert!(r.is_lent());
    assert!(!r.wait_returned(Duration::from_millis(10)));
    r.give_back();
    // One lease is still out: the storage stays.
    assert_eq!(std::sync::Arc::strong_count(&storage), 2);
    let waiter = std::thread::spawn({
        let r = r.clone();
        move || r.wait_returned(Duration::from_secs(10))
    });
    r.give_back();
    assert!(
        waiter.join().unwrap(),
        "the waiter woke when the last lease ended"
    );
    assert_eq!(
        std::sync::Arc::strong_count(&storage),
        1,
        "kept storage released"
    );
    assert!(!r.is_lent());
    r.close();
    assert_eq!(r.copy_into(0, 1, None, |_| ()), Err(Denied::Closed));
}

#[test]
fn listed_segments_are_handed_out_once_each_and_in_bounds() {
    let mut buf = [0u8; 12];
    let (a, b) = buf.split_at_mut(8);
    let descs = vec![Descriptor::from_mut_slice(a), Descriptor::from_mut_slice(b)];
    // SAFETY: the descriptors outlive the region and are not touched elsewhere.
    let r = unsafe { Region::new(&descs, true) };
    assert!(r.follows(0, 1) && !r.follows(1, 0) && !r.follows(1, 2));
    assert_eq!(
        r.copy_into_each(&[1, 0], |raw| raw.iter().map(|s| s.1).collect::<Vec<_>>()),
        Ok(vec![4, 8]),
        "in the order listed"
    );
    assert_eq!(r.copy_into_each(&[0, 0], |_| ()), Err(Denied::OutOfBounds));
    assert_eq!(r.copy_into_each(&[2], |_| ()), Err(Denied::OutOfBounds));
    r.close();
    assert_eq!(r.copy_into_each(&[0], |_| ()), Err(Denied::Closed));
    // SAFETY: as above.
    let ro = unsafe { Region::new(&descs, false) };
    assert_eq!(ro.copy_into_each(&[0], |_| ()), Err(Denied::OutOfBounds));
    ro.close();
}

/// Device memory (a made-up device address, never dereferenced):
/// every access that builds slices is refused, before any other check;
/// `copy_into` still hands its addresses to a puller, untouched.
#[test]
fn device_memory_is_refused_on_the_host_and_lent_by_address() {
    const FAKE: u64 = 0x7f00_dead_0000;
    // SAFETY: nothing dereferences these addresses: the region refuses
    // every host access of device memory, and the callbacks below only
    // read the pointers they are handed.
    let descs = unsafe {
        vec![
            Descriptor::from_cuda_ptr(FAKE, 4096, 1, true),
            Descriptor::from_cuda_ptr(FAKE + 8192, 100, 1, true),
        ]
    };
    // SAFETY: as above; the memory is never accessed through the region.
    let r = unsafe { Region::new(&descs, true) };
    assert!(!r.is_host());
    assert_eq!(r.device(), Some(Device::cuda(1)));
    let no = Err(Denied::NotHostMemory);
    assert_eq!(r.write_at(0, 0, 1, |_| unreachable!()), no);
    assert_eq!(r.read_at(0, 0, 1, |_| unreachable!()), no);
    assert_eq!(r.write_span(0, 0, 4096, |_| unreachable!()), no);
    assert_eq!(r.read_span(0, 0, 4196, |_| unreachable!()), no);
    // Refused before the bounds are looked at, and for empty spans.
    assert_eq!(r.read_at(9, 0, 0, |_| unreachable!()), no);
    assert_eq!(r.write_span(0, 0, 0, |_| unreachable!()), no);
    assert_eq!(r.read_span(0, u64::MAX, 0, |_| unreachable!()), no);
    let addrs = |raw: &[(*mut u8, usize)]| {
        raw.iter()
            .map(|&(p, n)| (p as usize as u64, n))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        r.copy_into(0, 2, None, addrs),
        Ok(vec![(FAKE, 4096), (FAKE + 8192, 100)])
    );
    assert_eq!(
        r.copy_into(0, 1, Some((10, 20)), addrs),
        Ok(vec![(FAKE + 10, 20)])
    );
    assert_eq!(
        r.copy_into_each(&[1, 0], addrs),
        Ok(vec![(FAKE + 8192, 100), (FAKE, 4096)])
    );
    assert_eq!(
        r.copy_into(0, 1, Some((4090, 7)), addrs),
        Err(Denied::OutOfBounds)
    );
    assert_eq!(r.segments(), vec![(FAKE, 4096), (FAKE + 8192, 100)]);
    assert!(r.seal_if_open(|| ()), "sealing touches no memory");
    r.close();
    assert_eq!(r.copy_into(0, 1, None, addrs), Err(Denied::Closed));
    assert_eq!(r.read_at(0, 0, 1, |_| unreachable!()), no);
    // Read-only device memory (a source) is refused the same way.
    // SAFETY: as above.
    let ro = unsafe { Region::new(&descs, false) };
    assert_eq!(ro.read_span(0, 0, 1, |_| unreachable!()), no);
    assert_eq!(ro.read_at(1, 0, 100, |_| unreachable!()), no);
    ro.close();
}

/// One descriptor of device memory makes the whole region device
/// memory: its host segments are not reached either.
#[test]
fn a_region_with_any_device_memory_is_not_host_memory() {
    // SAFETY: the device address is never dereferenced (see above).
    let descs = vec![Descriptor::from_vec(vec![5; 8]), unsafe {
        Descriptor::from_cuda_ptr(0x7f00_beef_0000, 64, 0, true)
    }];
    // SAFETY: as above; the vector outlives the region.
    let r = unsafe { Region::new(&descs, true) };
    assert!(!r.is_host());
    assert_eq!(r.device(), Some(Device::cuda(0)));
    assert_eq!(
        r.read_at(0, 0, 8, |s| s.to_vec()),
        Err(Denied::NotHostMemory)
    );
    r.close();
    let host = vec![Descriptor::from_vec(vec![5; 8])];
    // SAFETY: the vector outlives the region.
    let h = unsafe { Region::new(&host, true) };
    assert!(h.is_host() && h.device().is_none());
    assert_eq!(h.read_at(0, 0, 2, |s| s.to_vec()), Ok(vec![5, 5]));
    h.close();
}

#[test]
fn spans_join_blocks_of_one_pool_only() {
    let pool = crate::Pool::allocate(8 * 64, 64).unwrap();
    let mut buf = [0u8; 32];
    let (a, b) = buf.split_at_mut(16);
    let descs = vec![
        pool.blocks(&[0, 1, 2, 5, 6]).unwrap(),
        Descriptor::from_mut_slice(a),
        Descriptor::from_mut_slice(b),
    ];
    // SAFETY: the descriptors outlive the region and nothing else
    // touches them.
    let r = unsafe { Region::new(&descs, true) };
    let lens = |seg, off, len| {
        r.read_span(seg, off, len, |s| {
            s.iter().map(|s| s.len()).collect::<Vec<_>>()
        })
        .unwrap()
    };
    // Blocks 0-2 and 5-6 in two slices; two plain descriptors that
    // follow each other in memory stay two.
    assert_eq!(lens(0, 0, 5 * 64 + 32), vec![192, 128, 16, 16]);
    assert_eq!(lens(1, 10, 64 + 54 + 1), vec![118, 1]);
    assert_eq!(
        r.write_span(0, 0, 130, |s| s.iter().map(|s| s.len()).sum::<usize>()),
        Ok(130)
    );
    r.close();
}

#[test]
fn staged_accesses_are_for_device_memory_in_bounds_and_open_only() {
    use crate::cuda::CudaError;
    // Host memory: never handed to the device's copy engine.
    let host = vec![Descriptor::from_vec(vec![0u8; 64])];
    // SAFETY: owned memory, alive as long as `host`.
    let h = unsafe { Region::new(&host, true) };
    assert_eq!(
        h.stage_in(0, 0, &[1; 8]).map(|_| ()),
        Err(Denied::OutOfBounds)
    );
    assert_eq!(
        h.stage_out(0, 0, &mut [0; 8]).map(|_| ()),
        Err(Denied::OutOfBounds)
    );

    const FAKE: u64 = 0x7f00_dead_0000;
    // SAFETY: nothing dereferences these addresses: every access below is
    // refused before a copy, or reaches a copy engine that is not here
    // (the test returns early where CUDA is).
    let descs = unsafe {
        vec![
            Descriptor::from_cuda_ptr(FAKE, 4096, 1, true),
            Descriptor::from_cuda_ptr(FAKE + 8192, 100, 1, true),
        ]
    };
    // SAFETY: as above.
    let r = unsafe { Region::new(&descs, true) };
    // SAFETY: as above, read-only.
    let ro = unsafe { Region::new(&descs, false) };
    assert_eq!(
        ro.stage_in(0, 0, &[1; 8]).map(|_| ()),
        Err(Denied::OutOfBounds)
    );
    // Past the segments.
    assert_eq!(
        r.stage_in(1, 96, &[1; 8]).map(|_| ()),
        Err(Denied::OutOfBounds)
    );
    assert_eq!(
        r.stage_out(2, 0, &mut [0; 1]).map(|_| ()),
        Err(Denied::OutOfBounds)
    );
    if crate::cuda::available() {
        return println!("the rest needs a machine without CUDA (the addresses are made up)");
    }
    // In bounds and open: handed to the engine, which is not here.
    match r.stage_in(0, 4090, &[1; 16]) {
        Ok(Err(CudaError::Unavailable(_))) => {}
        other => panic!("{other:?}"),
    }
    match ro.stage_out(0, 0, &mut [0; 16]) {
        Ok(Err(CudaError::Unavailable(_))) => {}
        other => panic!("{other:?}"),
    }
    r.close();
    assert_eq!(r.stage_in(0, 0, &[1; 8]).map(|_| ()), Err(Denied::Closed));
    assert_eq!(
        r.stage_out(0, 0, &mut [0; 8]).map(|_| ()),
        Err(Denied::Closed)
    );
}
