//! The shared suite: READ and WRITE pairings between this process and a
//! `ferry peer` process, in both directions, checked byte for byte, once
//! over each transport between two processes (TCP, cross-memory attach for
//! every size, TCP striped over four streams for every transfer of 4 bytes
//! or more, and UCX for every size where UCX runs); each side must report
//! the transport that carried it.

mod common;

use common::*;
use ferry::TransportKind;
use ferry_cli::peer::{self, Cmd};

/// Runs the four directed pairings for one set of sizes over each transport
/// (UCX for every size too, where it runs).
async fn all_pairings(sizes: &[u64]) {
    let mut lanes = vec![
        (TransportKind::Tcp, 1),
        (TransportKind::Cma, 1),
        (TransportKind::Tcp, 4),
    ];
    match ferry::ucx::status() {
        Ok(_) => lanes.push((TransportKind::Ucx, 1)),
        Err(why) => eprintln!("ucx pairings skipped: {why}"),
    }
    for (t, streams) in lanes {
        pairings_over(sizes, t, streams).await;
    }
}

async fn pairings_over(sizes: &[u64], t: TransportKind, streams: usize) {
    let transports = match t {
        TransportKind::Cma | TransportKind::Ucx => vec![t, TransportKind::Tcp],
        other => vec![other],
    };
    let (local, p) = if streams > 1 {
        (
            connector_striped(streams).await,
            peer_striped(&transports, streams, &[]).await,
        )
    } else {
        (
            connector_over(&transports).await,
            peer_over(&transports, &[]).await,
        )
    };
    pairings_between(&local, &p, sizes, t, streams).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte() {
    all_pairings(&[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_kib() {
    all_pairings(&[4096]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_descriptors_of_mixed_sizes() {
    all_pairings(&mixed16()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_sized_descriptor_among_others() {
    all_pairings(&[0, 5, 0, 70_000, 0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fifty_six_mib() {
    all_pairings(&[256 << 20]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_descriptors_of_64_kib_and_one_of_4_mib() {
    all_pairings(&[64 << 10; 64]).await;
    all_pairings(&[4 << 20]).await;
}

/// The same pairings between workers that share a secret: every byte of
/// every connection, the cross-memory-attach probe and leases included,
/// goes through the secure channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_with_a_shared_secret() {
    const SECRET: &str = "a-secret-shared-by-both-processes";
    for (t, streams) in [
        (TransportKind::Tcp, 1),
        (TransportKind::Cma, 1),
        (TransportKind::Tcp, 4),
    ] {
        let transports = match t {
            TransportKind::Cma => vec![TransportKind::Cma, TransportKind::Tcp],
            other => vec![other],
        };
        let local = ferry::Connector::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .transports(&transports)
            .cma_threshold(0)
            .tcp_streams(streams)
            .stripe_threshold(4)
            .secret(SECRET)
            .build()
            .await
            .unwrap();
        let p = peer_with_env(&transports, streams, &[], &[(ferry::SECRET_ENV, SECRET)]).await;
        pairings_between(&local, &p, &[4096, 3 << 20, 1], t, streams).await;
    }
}

/// The peer process refuses cross-memory attach (a seccomp filter, as in a
/// default container profile): the permission is probed per connection, so
/// every transfer whose destination is the peer falls back to TCP, while
/// this process, which may attach, still copies by attach where it is the
/// destination. Every byte arrives either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_refused_by_the_kernel_falls_back_to_tcp() {
    let both = [TransportKind::Cma, TransportKind::Tcp];
    let local = connector_over(&both).await;
    let p = peer_over(&both, &["--deny-cma"]).await;
    let sizes = [1u64 << 20, 4096];
    let (cma, tcp) = (Some("cma"), Some("tcp"));

    // This process reads the peer: this process copies, by attach.
    let (mut a, meta) = expose(&p, Cmd::Readable, &sizes, 21).await;
    let read = local.begin_read(&meta, zeroed(&sizes)).await.unwrap();
    read.wait_for_completion().await.unwrap();
    assert_eq!(read.transport(), Some(TransportKind::Cma));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "{ev:?}");
    assert_eq!(ev.transport.as_deref(), cma, "{ev:?}");
    assert!(peer::verify(&read.into_descriptors(), 21));

    // The peer reads this process: the peer may not attach: TCP.
    let readable = local.create_readable(filled(&sizes, 22)).await.unwrap();
    let mut a = p
        .request(with_meta(req(Cmd::Read, &sizes, 22), readable.metadata()))
        .await
        .unwrap();
    readable.wait_for_completion().await.unwrap();
    assert_eq!(readable.transport(), Some(TransportKind::Tcp));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "{ev:?}");
    assert_eq!(ev.transport.as_deref(), tcp, "{ev:?}");
    assert_eq!(ev.verified, Some(true), "{ev:?}");

    // This process writes the peer: the peer would copy: TCP.
    let (mut a, meta) = expose(&p, Cmd::Writable, &sizes, 23).await;
    let write = local.begin_write(filled(&sizes, 23), &meta).await.unwrap();
    write.wait_for_completion().await.unwrap();
    assert_eq!(write.transport(), Some(TransportKind::Tcp));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "{ev:?}");
    assert_eq!(ev.transport.as_deref(), tcp, "{ev:?}");
    assert_eq!(ev.verified, Some(true), "{ev:?}");

    // The peer writes this process: this process copies, by attach.
    let writable = local.create_writable(zeroed(&sizes)).await.unwrap();
    let mut a = p
        .request(with_meta(req(Cmd::Write, &sizes, 24), writable.metadata()))
        .await
        .unwrap();
    writable.wait_for_completion().await.unwrap();
    assert_eq!(writable.transport(), Some(TransportKind::Cma));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "{ev:?}");
    assert_eq!(ev.transport.as_deref(), cma, "{ev:?}");
    assert!(peer::verify(&writable.into_descriptors(), 24));
    assert_eq!(local.pending_count(), 0);
}
