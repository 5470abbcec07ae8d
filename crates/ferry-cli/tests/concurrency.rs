//! Many operations at once between two processes.

mod common;

use std::time::Duration;

use common::*;
use ferry_cli::peer::{Cmd, Request};
use tokio::task::JoinSet;

fn size_of(i: usize) -> u64 {
    // 1 byte to 64 KiB, mixed.
    [1, 100, 4096, 4097, 65536][i % 5] + (i as u64 % 7)
}

const N: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_writes_each_passive_side_woken_by_its_own_notification() {
    let local = std::sync::Arc::new(connector().await);
    let p = peer().await;

    // The peer exposes 1,000 writables.
    let mut answers = Vec::new();
    for i in 0..N {
        answers.push(
            p.request(req(Cmd::Writable, &[size_of(i)], i as u64))
                .await
                .unwrap(),
        );
    }
    let mut metas = Vec::new();
    for a in &mut answers {
        let ev = a.expect("metadata").await.unwrap();
        metas.push(ferry::RdmaMetadata::from_json(ev.metadata.as_deref().unwrap()).unwrap());
    }

    // Write only the even ones, all at once.
    let mut set = JoinSet::new();
    for i in (0..N).step_by(2) {
        let (local, m) = (local.clone(), metas[i].clone());
        set.spawn(async move {
            let op = local
                .begin_write(filled(&[size_of(i)], i as u64), &m)
                .await?;
            op.wait_for_completion().await
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().expect("every write completes");
    }
    for i in (0..N).step_by(2) {
        let ev = done(&mut answers[i]).await;
        assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "op {i}: {ev:?}");
        assert_eq!(ev.verified, Some(true), "op {i}: {ev:?}");
    }
    // The odd ones were not woken: no answer, still exposed.
    let stats = p
        .request(Request::new(0, Cmd::Stats))
        .await
        .unwrap()
        .expect("stats")
        .await
        .unwrap();
    assert_eq!(stats.exposed, Some(N / 2), "{stats:?}");
    for i in (1..N).step_by(2) {
        assert!(
            answers[i].try_next().is_none(),
            "op {i} finished without a write"
        );
    }

    // Now the odd ones.
    for i in (1..N).step_by(2) {
        let (local, m) = (local.clone(), metas[i].clone());
        set.spawn(async move {
            let op = local
                .begin_write(filled(&[size_of(i)], i as u64), &m)
                .await?;
            op.wait_for_completion().await
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().expect("every write completes");
    }
    for i in (1..N).step_by(2) {
        let ev = done(&mut answers[i]).await;
        assert_eq!(ev.verified, Some(true), "op {i}: {ev:?}");
    }
    let stats = p
        .request(Request::new(0, Cmd::Stats))
        .await
        .unwrap()
        .expect("stats")
        .await
        .unwrap();
    assert_eq!(stats.exposed, Some(0));
    assert_eq!(
        stats.connections,
        Some(0),
        "the peer wrote nothing, so it opened no connection"
    );
    assert_eq!(
        local.connection_count(),
        1,
        "one pooled connection carried all 1,000 operations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_reads_from_this_process_complete() {
    let local = connector().await;
    let p = peer().await;

    let mut readables = Vec::new();
    let mut answers = Vec::new();
    for i in 0..N {
        let r = local
            .create_readable(filled(&[size_of(i)], i as u64))
            .await
            .unwrap();
        answers.push(
            p.request(with_meta(
                req(Cmd::Read, &[size_of(i)], i as u64),
                r.metadata(),
            ))
            .await
            .unwrap(),
        );
        readables.push(r);
    }
    let mut set = JoinSet::new();
    for r in readables {
        set.spawn(async move {
            r.wait_for_completion_timeout(Duration::from_secs(120))
                .await?;
            Ok::<_, ferry::Error>(r.status())
        });
    }
    while let Some(r) = set.join_next().await {
        assert_eq!(r.unwrap().unwrap(), ferry::OperationStatus::Complete);
    }
    for (i, a) in answers.iter_mut().enumerate() {
        let ev = done(a).await;
        assert_eq!(ev.verified, Some(true), "op {i}: {ev:?}");
    }
    assert_eq!(local.exposed_count(), 0);
}
