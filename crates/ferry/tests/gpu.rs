//! Descriptors of device memory (`cuda:N`): described, never read on the
//! host, and refused by every operation with an error that says why where
//! there is no CUDA; where there is, accepted (they move by CUDA IPC:
//! `tests/cuda_ipc.rs`), except mixed with host memory in one operation.
//!
//! The machine these were written on has no GPU: what runs everywhere is
//! the refusal. The checks that need a real GPU skip, saying so, where
//! `ferry::cuda::available()` is false; they passed on one H100 on
//! 2026-11-24.

use bytes::Bytes;
use ferry::cuda::{CudaBuffer, CudaError};
use ferry::{Connector, Descriptor, Device, Error, Pool};

async fn pair() -> (Connector, Connector) {
    let build = || {
        Connector::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .build()
    };
    (build().await.unwrap(), build().await.unwrap())
}

/// An address on a GPU; never dereferenced by these tests.
const FAKE: u64 = 0x7f00_dead_0000;

fn cuda(ordinal: u32, writable: bool) -> Descriptor<'static> {
    // SAFETY: the address is never used: every operation refuses device
    // memory before a region exists over it, and `as_slice` is `None`.
    unsafe { Descriptor::from_cuda_ptr(FAKE, 4096, ordinal, writable) }
}

/// The error expected for descriptor `index` on `device` on this host.
fn assert_refused(err: &Error, index: usize, device: Device) {
    assert!(err.is_misuse(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("descriptor {index} is on {device}")),
        "{text}"
    );
    if ferry::cuda::available() {
        // Only refused where mixed with host memory.
        assert!(
            matches!(err, Error::NoDeviceTransport { index: i, device: d, .. } if *i == index && *d == device),
            "{err:?}"
        );
        assert!(text.contains("all on one GPU"), "{text}");
    } else {
        let why = ferry::cuda::status().unwrap_err();
        match err {
            Error::CudaUnavailable {
                index: i,
                device: d,
                reason,
            } => {
                assert_eq!((*i, *d), (index, device));
                assert_eq!(reason, &why, "the reason is what cuda::status() says");
            }
            other => panic!("expected CudaUnavailable, got {other:?}"),
        }
        assert!(
            text.contains("CUDA is not available on this host"),
            "{text}"
        );
        assert!(text.contains(&why), "{text}");
    }
}

#[test]
fn device_descriptors_are_never_host_memory() {
    let mut d = cuda(3, true);
    assert_eq!(
        (d.device(), d.size(), d.is_writable(), d.block_count()),
        (Device::cuda(3), 4096, true, 1)
    );
    assert_eq!(d.device_ptr(), Some(FAKE));
    assert!(d.as_slice().is_none());
    assert!(d.as_mut_slice().is_none());
    assert!(!cuda(0, false).is_writable());
    // SAFETY: empty: there is nothing to read.
    let empty = unsafe { Descriptor::from_cuda_ptr(0, 0, 0, true) };
    assert_eq!((empty.size(), empty.device_ptr()), (0, Some(0)));
    // Host memory has bytes and no device address.
    let host = Descriptor::from_vec(vec![1, 2, 3]);
    assert_eq!(
        (host.device_ptr(), host.as_slice()),
        (None, Some(&[1u8, 2, 3][..]))
    );
}

#[tokio::test]
async fn every_operation_refuses_device_memory_with_the_reason() {
    let (a, b) = pair().await;
    assert_eq!(a.is_cuda_available(), ferry::cuda::available());
    let err = a
        .create_writable(vec![vec![0u8; 8].into(), cuda(2, true)])
        .await
        .unwrap_err();
    if ferry::cuda::available() {
        // Where the driver is, it is asked first: an address it does not
        // know as memory of that GPU is refused before anything else
        // (the refusal of real device memory mixed with host memory:
        // a_cuda_buffer_is_unavailable_here_or_accepted_by_operations).
        assert!(
            matches!(&err, Error::NotDeviceMemory { index: 1, device, .. } if *device == Device::cuda(2)),
            "{err:?}"
        );
        assert!(err.is_misuse(), "{err}");
        println!("skipped the rest: CUDA is here, device memory is accepted (tests/cuda_ipc.rs)");
        return;
    }
    // Mixed with host memory: refused everywhere.
    assert_refused(&err, 1, Device::cuda(2));
    println!(
        "no CUDA here ({}): checking the CudaUnavailable refusal",
        ferry::cuda::status().unwrap_err()
    );
    let err = a.create_readable(vec![cuda(0, false)]).await.unwrap_err();
    assert_refused(&err, 0, Device::cuda(0));

    // The active side: local device memory is refused before the remote's
    // metadata is looked at (sizes differ here on purpose).
    let readable = b.create_readable(vec![vec![7u8; 8].into()]).await.unwrap();
    let err = a
        .begin_read(readable.metadata(), vec![cuda(1, true)])
        .await
        .unwrap_err();
    assert_refused(&err, 0, Device::cuda(1));
    let writable = b.create_writable(vec![vec![0u8; 8].into()]).await.unwrap();
    let err = a
        .begin_write(vec![cuda(0, false)], writable.metadata())
        .await
        .unwrap_err();
    assert_refused(&err, 0, Device::cuda(0));

    assert_eq!(a.exposed_count(), 0, "nothing was exposed");
    assert_eq!(a.metrics().errors("cuda_unavailable"), 4);
    assert_eq!(a.metrics().errors("unsupported_device"), 0);
}

#[tokio::test]
async fn read_only_device_memory_is_refused_as_read_only_first() {
    let (a, b) = pair().await;
    let err = a.create_writable(vec![cuda(0, false)]).await.unwrap_err();
    assert!(
        matches!(err, Error::ReadOnlyDescriptor { index: 0, .. }),
        "{err}"
    );
    let readable = b
        .create_readable(vec![Descriptor::from_bytes(Bytes::from_static(
            b"12345678",
        ))])
        .await
        .unwrap();
    let err = a
        .begin_read(readable.metadata(), vec![cuda(0, false)])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ReadOnlyDescriptor { .. }), "{err}");
}

#[tokio::test]
async fn blocks_of_a_device_pool_are_refused_too() {
    let (a, _b) = pair().await;
    // SAFETY: never dereferenced: host access to a device pool is refused,
    // and the operation refuses its blocks before any region exists.
    let pool = unsafe {
        Pool::from_raw_parts(
            FAKE as usize as *mut u8,
            8192,
            1024,
            Device::cuda(0),
            true,
            (),
        )
    }
    .unwrap();
    assert!(pool.with_block(0, |_| ()).is_err());
    let blocks = pool.blocks(&[1, 5]).unwrap();
    assert!(blocks.as_slice().is_none());
    let err = a
        .create_readable(vec![vec![0u8; 4].into(), blocks])
        .await
        .unwrap_err();
    assert_refused(&err, 1, Device::cuda(0));
    // The refused descriptor was dropped with the call: its blocks are free.
    assert!(pool.blocks(&[1, 5]).is_ok());
}

#[tokio::test]
async fn a_cuda_buffer_is_unavailable_here_or_accepted_by_operations() {
    let buf = match CudaBuffer::new(0, 1 << 20) {
        Err(CudaError::Unavailable(why)) => {
            assert!(!ferry::cuda::available());
            println!("skipped: CUDA unavailable ({why}); needs a GPU");
            return;
        }
        other => other.expect("a GPU is here: the allocation must succeed"),
    };
    assert_eq!((buf.device(), buf.len()), (Device::cuda(0), 1 << 20));
    let (a, _b) = pair().await;
    let d = buf.into_descriptor();
    assert!(d.as_slice().is_none());
    // Accepted where CUDA is: it moves by CUDA IPC (tests/cuda_ipc.rs).
    let op = a.create_readable(vec![d]).await.unwrap();
    let m = op.metadata();
    assert_eq!(m.descriptors()[0].device, Device::cuda(0));
    // Mixed with host memory, refused.
    let buf = CudaBuffer::new(0, 64).unwrap();
    let err = a
        .create_readable(vec![vec![0u8; 4].into(), buf.into_descriptor()])
        .await
        .unwrap_err();
    assert_refused(&err, 1, Device::cuda(0));
}
