//! The public API within one process: misuse, borrowed memory, Send futures.

use std::time::Duration;

use bytes::Bytes;
use ferry::{Connector, Descriptor, Device, Error, OperationStatus, TransportKind};

async fn pair() -> (Connector, Connector) {
    let a = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap();
    let b = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap();
    (a, b)
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn public_futures_and_operations_are_send() {
    let (a, b) = pair().await;
    let r = a.create_readable(vec![vec![1u8; 8].into()]).await.unwrap();
    assert_send(&r);
    let fut = b.begin_read(r.metadata(), vec![vec![0u8; 8].into()]);
    assert_send(&fut);
    let op = fut.await.unwrap();
    assert_send(&op.wait_for_completion());
    assert_send(&r.wait_for_completion());
    assert_send(&a.create_writable(vec![vec![0u8; 1].into()]));
    op.wait_for_completion().await.unwrap();
}

#[tokio::test]
async fn misuse_is_a_typed_error() {
    let (a, b) = pair().await;
    assert!(matches!(
        a.create_readable(vec![]).await,
        Err(Error::NoDescriptors)
    ));
    let ro = Descriptor::from_bytes(Bytes::from_static(b"read only"));
    assert!(!ro.is_writable());
    let err = a
        .create_writable(vec![vec![0u8; 4].into(), ro])
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ReadOnlyDescriptor { index: 1, .. }),
        "{err}"
    );
    assert!(err.is_misuse());

    // A read-only buffer may be read by a remote...
    let r = a
        .create_readable(vec![Descriptor::from_bytes(Bytes::from_static(
            b"read only",
        ))])
        .await
        .unwrap();
    // ...but is no destination for a read.
    let err = b
        .begin_read(
            r.metadata(),
            vec![Descriptor::from_bytes(Bytes::from_static(b"123456789"))],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ReadOnlyDescriptor { .. }), "{err}");

    // SAFETY: the descriptor is refused before its (dangling, empty) memory
    // could be touched.
    let cuda =
        unsafe { Descriptor::from_raw_parts(std::ptr::null_mut(), 0, Device::cuda(0), true) };
    let err = a.create_readable(vec![cuda]).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::CudaUnavailable { .. } | Error::NoDeviceTransport { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("cuda:0"), "{err}");

    let err = Connector::builder()
        .transports(&[])
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::InvalidSetting(ferry::config::SettingError {
                problem: ferry::config::Problem::NoTcp,
                ..
            })
        ),
        "{err}"
    );
    let err = "rdma".parse::<TransportKind>().unwrap_err();
    assert!(err.to_string().contains("local, cma, ucx, tcp"), "{err}");
    assert_eq!(a.exposed_count(), 1);
}

#[tokio::test]
async fn device_and_status_follow_the_reference() {
    assert_eq!("cuda".parse::<Device>().unwrap(), Device::cuda(0));
    assert_eq!("cuda:3".parse::<Device>().unwrap().to_string(), "cuda:3");
    assert!("tpu:0".parse::<Device>().is_err());
    let names: Vec<_> = (0..6)
        .map(|n| OperationStatus::from_u8(n).unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "UNINITIALIZED",
            "INITIALIZED",
            "IN_PROGRESS",
            "COMPLETE",
            "CANCELLED",
            "ERRORED"
        ]
    );
}

#[tokio::test]
async fn metadata_debug_never_shows_the_token() {
    let (a, _) = pair().await;
    let r = a.create_writable(vec![vec![0u8; 8].into()]).await.unwrap();
    let json = r.metadata().to_json();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let token = v["token"].as_str().unwrap().to_string();
    assert_eq!(token.len(), 32);
    assert!(!format!("{:?}", r.metadata()).contains(&token));
    assert!(!format!("{r:?}").contains(&token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn borrowed_memory_through_a_scope() {
    let (a, b) = pair().await;
    let handle = tokio::runtime::Handle::current();
    let (source, dest) = tokio::task::spawn_blocking(move || {
        let source = vec![42u8; 1 << 20];
        let mut dest = vec![0u8; 1 << 20];
        a.scope(|s| {
            b.scope(|t| {
                handle.block_on(async {
                    let r = s
                        .create_readable(vec![Descriptor::from_slice(&source)])
                        .await
                        .unwrap();
                    let read = t
                        .begin_read(r.metadata(), vec![Descriptor::from_mut_slice(&mut dest)])
                        .await
                        .unwrap();
                    read.wait_for_completion().await.unwrap();
                    r.wait_for_completion().await.unwrap();
                })
            })
        });
        (source, dest)
    })
    .await
    .unwrap();
    assert_eq!(source, dest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaked_operation_over_borrowed_memory_is_fenced_when_its_scope_ends() {
    let (a, b) = pair().await;
    let handle = tokio::runtime::Handle::current();
    let (meta, dest, a) = tokio::task::spawn_blocking(move || {
        let mut dest = vec![0u8; 4096];
        let meta = a.scope(|s| {
            handle.block_on(async {
                let w = s
                    .create_writable(vec![Descriptor::from_mut_slice(&mut dest)])
                    .await
                    .unwrap();
                let m = w.metadata().clone();
                std::mem::forget(w);
                m
            })
        });
        // The scope has ended: `dest` is ours again, and no remote may write it.
        (meta, dest, a)
    })
    .await
    .unwrap();
    let w = b
        .begin_write(vec![vec![9u8; 4096].into()], &meta)
        .await
        .unwrap();
    let err = w.wait_for_completion().await.unwrap_err();
    assert!(matches!(err, Error::Rejected { .. }), "{err}");
    assert!(
        dest.iter().all(|&x| x == 0),
        "a write landed after the scope ended"
    );
    assert_eq!(a.exposed_count(), 0);
}

#[tokio::test]
async fn into_descriptors_before_the_end_cancels() {
    let (a, b) = pair().await;
    let w = a.create_writable(vec![vec![0u8; 16].into()]).await.unwrap();
    let meta = w.metadata().clone();
    assert!(
        w.descriptors().is_none(),
        "no access while a remote may write"
    );
    let back = w.into_descriptors();
    assert_eq!(back[0].size(), 16);
    let op = b
        .begin_write(vec![vec![1u8; 16].into()], &meta)
        .await
        .unwrap();
    assert!(op
        .wait_for_completion_timeout(Duration::from_secs(5))
        .await
        .is_err());
    assert!(back[0].as_slice().unwrap().iter().all(|&x| x == 0));
}

#[tokio::test]
async fn same_process_transfer_reports_its_transport() {
    let (a, b) = pair().await;
    let w = a
        .create_writable(vec![vec![0u8; 100].into()])
        .await
        .unwrap();
    let op = b
        .begin_write(vec![vec![5u8; 100].into()], w.metadata())
        .await
        .unwrap();
    op.wait_for_completion().await.unwrap();
    w.wait_for_completion().await.unwrap();
    assert_eq!(
        op.transport(),
        Some(TransportKind::Local),
        "same process: a plain copy"
    );
    assert_eq!(w.transport(), Some(TransportKind::Local));
    assert_eq!(
        w.descriptors().unwrap()[0].as_slice().unwrap(),
        &[5u8; 100][..]
    );
}
