//! Standing grants over TCP: each operation of the holder is one request
//! that the owner's runtime checks and serves (one round trip), over an
//! authenticated connection. Across processes: READ and WRITE by index
//! with bytes checked, notifications, a retired generation refused, a
//! revoke during concurrent writes (sentinel), a holder killed mid-write.
//! In one process: hostile requests refused by the owner's own checks
//! (the holder's metadata tampered with so that its local checks pass),
//! with no byte outside the range moved; transfers larger than one
//! request; the fallback from cross-memory attach.

use std::io::Write as _;
use std::time::{Duration, Instant};

use ferry::{
    BlockRef, Connector, Error, Grant, GrantError, GrantLane, GrantMetadata, GrantOptions,
    NotificationKind, Pool, RemoteGrant, Rights,
};

#[allow(dead_code)]
#[path = "support/spawned.rs"]
mod spawned;
#[allow(dead_code)]
#[path = "support/grant.rs"]
mod support;

use support::{all_are, block_bytes, cue, fill, holds, name, spec, tell, BLOCK};

use spawned::{runtime, Server};

const ROLE: &str = "FERRY_GRANT_TCP_TEST_ROLE";
const SECRET: &str = "grant-tcp-test-secret";

async fn connector(worker: &str) -> Connector {
    Connector::builder()
        .worker_id(worker)
        .secret(SECRET)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap()
}

fn holder(spec: &str) {
    let (role, json) = spec.split_once(' ').unwrap();
    let meta = GrantMetadata::from_json(json).unwrap();
    runtime().block_on(async move {
        let me = connector(role).await;
        let g = me.open_grant_via(&meta, GrantLane::Tcp).await.unwrap();
        assert_eq!(g.lane(), GrantLane::Tcp);
        println!("OPEN");
        match role {
            "rw" => rw_holder(&g).await,
            "writers" => writers(g).await,
            "victim" => victim(&g).await,
            other => panic!("no role {other}"),
        }
    });
}

fn percentiles(t: &mut [Duration]) -> (Duration, Duration) {
    t.sort();
    (t[t.len() / 2], t[t.len() * 99 / 100])
}

async fn next(g: &Grant) -> ferry::Notification {
    tokio::time::timeout(Duration::from_secs(10), g.next_notification())
        .await
        .expect("a notification within 10 s")
        .expect("the grant lives")
}

// ---------------------------------------------------------------------------
// READ and WRITE by index across processes.

async fn rw_holder(g: &RemoteGrant) {
    let local = Pool::allocate(16 * BLOCK, BLOCK).unwrap();
    let refs = g.block_refs(&[3, 4, 9]).unwrap();
    g.read_blocks(&refs, &local, &[0, 1, 2]).await.unwrap();
    for (l, r) in [(0, 3), (1, 4), (2, 9)] {
        assert!(holds(&local, l, &block_bytes(1, r)), "block {r} read");
    }
    println!("READ ok");
    for l in 5..8 {
        fill(&local, l, &block_bytes(2, l));
    }
    let r = g.block_refs(&[10, 11]).unwrap();
    g.write_blocks(&local, &[5, 6], &r, Some(b"first"))
        .await
        .unwrap();
    let r = g.block_refs(&[12]).unwrap();
    g.write_blocks(&local, &[7], &r, Some(b"second"))
        .await
        .unwrap();
    println!("WROTE");
    assert_eq!(cue(), "retired");
    fill(&local, 8, &[0xee; BLOCK]);
    let stale = g.write_blocks(&local, &[8], &r, Some(b"stale")).await;
    println!("STALE {}", name(&stale));
    // The refusal taught this holder the block's generation.
    let fresh = g.block_refs(&[12]).unwrap();
    println!("GENERATION {}", fresh[0].generation);
    let n = 500;
    let one = g.block_refs(&[0]).unwrap();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        g.read_blocks(&one, &local, &[9]).await.unwrap();
        times.push(t.elapsed());
    }
    let read = percentiles(&mut times);
    times.clear();
    let one = g.block_refs(&[15]).unwrap();
    for _ in 0..n {
        let t = Instant::now();
        g.write_blocks(&local, &[9], &one, None).await.unwrap();
        times.push(t.elapsed());
    }
    let write = percentiles(&mut times);
    println!(
        "LATENCY tcp 4KiB read p50 {:?} p99 {:?}, write p50 {:?} p99 {:?}",
        read.0, read.1, write.0, write.1
    );
    println!("DONE");
    assert_eq!(cue(), "");
}

#[test]
fn read_and_write_blocks_over_tcp_across_processes() {
    if spawned::served(ROLE, holder) {
        return;
    }
    runtime().block_on(async {
        let owner = connector("owner").await;
        let pool = Pool::allocate(16 * BLOCK, BLOCK).unwrap();
        for i in 0..16 {
            fill(&pool, i, &block_bytes(1, i));
        }
        let g = owner
            .grant(&pool, GrantOptions::read_write().holder("rw"))
            .await
            .unwrap();
        assert!(g.metadata().tcp.is_some());
        let mut h = Server::start(
            "read_and_write_blocks_over_tcp_across_processes",
            ROLE,
            &spec("rw", &g),
        );
        h.after("OPEN");
        h.after("READ ok");
        h.after("WROTE");
        let n1 = next(&g).await;
        let n2 = next(&g).await;
        assert_eq!(
            (
                n1.seq,
                n1.kind,
                n1.first_block,
                n1.block_count,
                &n1.payload[..]
            ),
            (1, NotificationKind::Write, 10, 2, &b"first"[..])
        );
        assert_eq!(
            (n2.seq, n2.first_block, n2.block_count, &n2.payload[..]),
            (2, 12, 1, &b"second"[..])
        );
        for (r, l) in [(10, 5), (11, 6), (12, 7)] {
            assert!(holds(&pool, r, &block_bytes(2, l)), "block {r} written");
        }
        for i in (0..10).chain(13..16) {
            assert!(holds(&pool, i, &block_bytes(1, i)), "block {i} untouched");
        }
        let fresh = g.retire(&[12]).await.unwrap();
        assert_eq!(fresh, vec![BlockRef::new(12, 1)]);
        tell(&mut h, "retired");
        assert_eq!(h.after("STALE "), "StaleGeneration");
        assert_eq!(h.after("GENERATION "), "1");
        assert!(holds(&pool, 12, &block_bytes(2, 7)), "a stale write landed");
        println!("holder: {}", h.after("LATENCY "));
        h.after("DONE");
        assert!(g.try_next_notification().is_none());
        drop(h);
    });
}

// ---------------------------------------------------------------------------
// Revoke during 1,000 concurrent writes over TCP.

const WRITERS: u32 = 8;
const WRITES: u32 = 1000;
const WBLOCK: usize = 256 << 10;

async fn writers(g: RemoteGrant) {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use std::sync::Arc;
    let local = Pool::allocate(WRITERS as usize * WBLOCK, WBLOCK).unwrap();
    for w in 0..WRITERS {
        fill(&local, w, &[0xab; WBLOCK]);
    }
    let ok = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (g, local, ok) = (g.clone(), local.clone(), ok.clone());
        tasks.push(tokio::spawn(async move {
            let (mut revoked, mut other, mut late) = (0u32, 0u32, 0u32);
            for k in 0..WRITES / WRITERS {
                let index = w + WRITERS * (k % 8);
                let r = [BlockRef::new(index, 0)];
                match g.write_blocks(&local, &[w], &r, None).await {
                    Ok(()) if revoked > 0 => late += 1,
                    Ok(()) => {
                        if ok.fetch_add(1, SeqCst) + 1 == WRITES / 4 {
                            println!("QUARTER");
                        }
                    }
                    Err(Error::Grant(GrantError::Revoked)) => revoked += 1,
                    Err(e) => {
                        eprintln!("writer {w}: {e}");
                        other += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (revoked, other, late)
        }));
    }
    let (mut revoked, mut other, mut late) = (0, 0, 0);
    for t in tasks {
        let (r, o, l) = t.await.unwrap();
        revoked += r;
        other += o;
        late += l;
    }
    let ok = ok.load(SeqCst);
    println!("TOTALS ok {ok} revoked {revoked} other {other} late {late}");
    assert_eq!(cue(), "filled");
    let mut again = Vec::new();
    for w in 0..WRITERS {
        let r = [BlockRef::new(w, 0)];
        again.push(name(&g.write_blocks(&local, &[w], &r, None).await));
    }
    again.dedup();
    println!("AGAIN {}", again.join(","));
    assert_eq!(cue(), "");
}

#[test]
fn no_byte_lands_after_revoke_during_concurrent_tcp_writes() {
    if spawned::served(ROLE, holder) {
        return;
    }
    runtime().block_on(async {
        let owner = connector("owner").await;
        let blocks = 64u32;
        let pool = Pool::allocate(blocks as usize * WBLOCK, WBLOCK).unwrap();
        let g = owner
            .grant(&pool, GrantOptions::write().holder("writers"))
            .await
            .unwrap();
        let mut h = Server::start(
            "no_byte_lands_after_revoke_during_concurrent_tcp_writes",
            ROLE,
            &spec("writers", &g),
        );
        h.after("OPEN");
        h.after("QUARTER");
        g.revoke().await.unwrap();
        for i in 0..blocks {
            pool.with_block_mut(i, |b| b.fill(0x5a)).unwrap();
        }
        let totals = h.after("TOTALS ");
        println!("writers: {totals}");
        let n: Vec<u32> = totals
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let (ok, revoked, other, late) = (n[0], n[1], n[2], n[3]);
        assert_eq!(ok + revoked + other + late, WRITES, "{totals}");
        assert!(ok >= WRITES / 4 && revoked > 0, "{totals}");
        assert_eq!((other, late), (0, 0), "{totals}");
        tell(&mut h, "filled");
        assert_eq!(h.after("AGAIN "), "Revoked");
        tokio::time::sleep(Duration::from_millis(20)).await;
        for i in 0..blocks {
            assert!(
                all_are(&pool, i, 0x5a),
                "a byte landed in block {i} after revoke"
            );
        }
        drop(h);
    });
}

// ---------------------------------------------------------------------------
// A holder killed mid-write.

async fn victim(g: &RemoteGrant) {
    // 32 blocks of 64 KiB: 2 MiB a write, two requests.
    let local = Pool::allocate(32 * 65536, 65536).unwrap();
    for i in 0..32 {
        local.with_block_mut(i, |b| b.fill(0xcc)).unwrap();
    }
    let ids: Vec<u32> = (0..32).collect();
    let refs: Vec<BlockRef> = ids.iter().map(|&i| BlockRef::new(i, 0)).collect();
    let mut first = true;
    loop {
        g.write_blocks(&local, &ids, &refs, None).await.unwrap();
        if first {
            println!("WRITING");
            first = false;
        }
    }
}

#[test]
fn a_tcp_holder_killed_mid_write_leaves_the_owner_intact() {
    if spawned::served(ROLE, holder) {
        return;
    }
    runtime().block_on(async {
        let owner = connector("owner").await;
        let bs = 65536;
        let pool = Pool::allocate(64 * bs, bs).unwrap();
        for i in 32..64 {
            pool.with_block_mut(i, |b| b.fill(i as u8)).unwrap();
        }
        let doomed = owner
            .grant(&pool, GrantOptions::write().holder("victim"))
            .await
            .unwrap();
        let other = owner
            .grant(&pool, GrantOptions::read_write().bearer())
            .await
            .unwrap();
        let mut h = Server::start(
            "a_tcp_holder_killed_mid_write_leaves_the_owner_intact",
            ROLE,
            &spec("victim", &doomed),
        );
        h.after("WRITING");
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.child.kill().unwrap();
        let t = Instant::now();
        doomed.revoke().await.unwrap();
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        let _ = h.child.wait();
        for i in 32..64 {
            assert!(all_are(&pool, i, i as u8), "block {i} changed");
        }
        let holder = connector("other").await;
        let og = holder
            .open_grant_via(other.metadata(), GrantLane::Tcp)
            .await
            .unwrap();
        let mine = Pool::allocate(2 * bs, bs).unwrap();
        mine.with_block_mut(0, |b| b.fill(0x42)).unwrap();
        let r = og.block_refs(&[3, 40]).unwrap();
        og.write_blocks(&mine, &[0], &r[..1], None).await.unwrap();
        og.read_blocks(&r[1..], &mine, &[1]).await.unwrap();
        assert!(all_are(&pool, 3, 0x42));
        assert!(all_are(&mine, 1, 40));
        drop(h);
    });
}

// ---------------------------------------------------------------------------
// In one process: hostile requests, large transfers, the fallback.

fn grant_err(r: ferry::Result<()>) -> GrantError {
    match r {
        Err(Error::Grant(e)) => e,
        other => panic!("expected a grant refusal, got {other:?}"),
    }
}

/// Opens `meta` (tampered with) by TCP from `worker`.
async fn open(worker: &Connector, meta: &GrantMetadata) -> RemoteGrant {
    worker.open_grant_via(meta, GrantLane::Tcp).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_refused_by_the_owner_and_move_nothing() {
    let owner = connector("owner").await;
    let eve = connector("eve").await;
    let pool = Pool::allocate(8 * BLOCK, BLOCK).unwrap();
    for i in 0..8 {
        fill(&pool, i, &[i as u8; BLOCK]);
    }
    let mine = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
    mine.with_block_mut(0, |b| b.fill(0xee)).unwrap();
    let untouched = |pool: &Pool| (0..8).all(|i| all_are(pool, i, i as u8));
    let one = [BlockRef::new(1, 0)];

    // Another worker's grant: eve strips the binding from its copy, the
    // owner still checks it against the connection's peer.
    let bound = owner
        .grant(&pool, GrantOptions::read_write().holder("bob"))
        .await
        .unwrap();
    let mut m = bound.metadata().clone();
    m.holder = None;
    let g = open(&eve, &m).await;
    let e = grant_err(g.write_blocks(&mine, &[0], &one, None).await);
    assert!(
        matches!(e, GrantError::NotYours { ref holder, ref me } if holder == "bob" && me == "eve"),
        "{e}"
    );
    assert!(matches!(
        grant_err(g.read_blocks(&one, &mine, &[1]).await),
        GrantError::NotYours { .. }
    ));

    // A forged token, and a grant id the owner does not have.
    let open_grant = owner
        .grant(&pool, GrantOptions::read().bearer())
        .await
        .unwrap();
    let mut m = open_grant.metadata().clone();
    m.token = ferry_proto::Token::from_bytes([0x11; 16]);
    let g = open(&eve, &m).await;
    assert_eq!(
        grant_err(g.read_blocks(&one, &mine, &[1]).await),
        GrantError::Forged { what: "token" }
    );
    let mut m = open_grant.metadata().clone();
    m.grant = ferry::grant::GrantId(u64::MAX);
    let g = open(&eve, &m).await;
    assert_eq!(
        grant_err(g.read_blocks(&one, &mine, &[1]).await),
        GrantError::Forged { what: "token" }
    );

    // Rights missing: eve claims WRITE on a READ grant.
    let mut m = open_grant.metadata().clone();
    m.rights = Rights::READ_WRITE;
    let g = open(&eve, &m).await;
    assert!(matches!(
        grant_err(g.write_blocks(&mine, &[0], &one, None).await),
        GrantError::RightsMissing { .. }
    ));

    // Out of range: eve claims more blocks than granted.
    let mut m = open_grant.metadata().clone();
    m.block_count = 1000;
    let g = open(&eve, &m).await;
    assert_eq!(
        grant_err(g.read_blocks(&[BlockRef::new(8, 0)], &mine, &[1]).await),
        GrantError::OutOfRange { index: 8, count: 8 }
    );
    // A range past the named blocks: eve claims larger blocks.
    let mut m = open_grant.metadata().clone();
    m.block_size = 2 * BLOCK as u64;
    let big = Pool::allocate(2 * 2 * BLOCK, 2 * BLOCK).unwrap();
    let g = open(&eve, &m).await;
    assert!(matches!(
        grant_err(g.read_blocks(&[BlockRef::new(7, 0)], &big, &[0]).await),
        GrantError::LengthMismatch { what: "bytes", .. }
    ));

    // Expired: eve drops the expiry from its copy.
    let short = owner
        .grant(
            &pool,
            GrantOptions::read_write()
                .bearer()
                .expires_after(Duration::from_millis(50)),
        )
        .await
        .unwrap();
    let mut m = short.metadata().clone();
    m.expires_at_ms = None;
    let g = open(&eve, &m).await;
    g.read_blocks(&one, &mine, &[1]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let e = grant_err(g.write_blocks(&mine, &[0], &one, None).await);
    assert!(
        matches!(e, GrantError::Expired { .. } | GrantError::Revoked),
        "{e}"
    );

    // Revoked, then dropped: refused either way.
    let rw = owner
        .grant(&pool, GrantOptions::read_write().holder("eve"))
        .await
        .unwrap();
    let g = open(&eve, rw.metadata()).await;
    assert!(all_are(&mine, 0, 0xee));
    rw.revoke().await.unwrap();
    assert_eq!(
        grant_err(g.write_blocks(&mine, &[0], &one, None).await),
        GrantError::Revoked
    );
    assert!(g.is_revoked());
    drop(rw);
    assert_eq!(
        grant_err(g.write_blocks(&mine, &[0], &one, None).await),
        GrantError::Revoked
    );

    // A retired generation.
    let rw = owner
        .grant(&pool, GrantOptions::read_write().holder("eve"))
        .await
        .unwrap();
    let g = open(&eve, rw.metadata()).await;
    rw.retire(&[1]).await.unwrap();
    assert_eq!(
        grant_err(g.write_blocks(&mine, &[0], &one, None).await),
        GrantError::StaleGeneration {
            index: 1,
            named: 0,
            current: 1
        }
    );
    // An oversize notification is refused before anything is sent.
    let fresh = g.block_refs(&[1]).unwrap();
    assert!(matches!(
        grant_err(g.write_blocks(&mine, &[0], &fresh, Some(&[0; 257])).await),
        GrantError::NotificationTooLarge { .. }
    ));
    assert!(untouched(&pool), "a refused request moved bytes");
    // And the grant still works after all of it.
    g.write_blocks(&mine, &[0], &fresh, None).await.unwrap();
    assert!(all_are(&pool, 1, 0xee));
    assert!((0..8)
        .filter(|&i| i != 1)
        .all(|i| all_are(&pool, i, i as u8)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_larger_than_one_request_move_every_byte() {
    let owner = connector("owner").await;
    let holder = connector("holder").await;
    // 3 MiB blocks (a block spans several requests), and many small ones.
    for (bs, blocks) in [(3 << 20, 2usize), (BLOCK, 600)] {
        let pool = Pool::allocate(bs * (blocks + 1), bs).unwrap();
        let g = owner
            .grant(&pool, GrantOptions::read_write().holder("holder"))
            .await
            .unwrap();
        let r = holder
            .open_grant_via(g.metadata(), GrantLane::Tcp)
            .await
            .unwrap();
        let mine = Pool::allocate(bs * 2 * blocks, bs).unwrap();
        for i in 0..blocks as u32 {
            mine.with_block_mut(i, |b| {
                for (k, x) in b.iter_mut().enumerate() {
                    *x = (k as u32).wrapping_mul(31).wrapping_add(i) as u8;
                }
            })
            .unwrap();
        }
        let local: Vec<u32> = (0..blocks as u32).collect();
        // Into the owner's blocks 1.., reversed.
        let remote: Vec<BlockRef> = (0..blocks as u32)
            .rev()
            .map(|i| BlockRef::new(i + 1, 0))
            .collect();
        r.write_blocks(&mine, &local, &remote, Some(b"big"))
            .await
            .unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), g.next_notification())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&n.payload[..], b"big");
        assert!(all_are(&pool, 0, 0), "block 0 was not named");
        let back: Vec<u32> = (blocks as u32..2 * blocks as u32).collect();
        r.read_blocks(&remote, &mine, &back).await.unwrap();
        for i in 0..blocks as u32 {
            let a = mine.with_block(i, |b| b.to_vec()).unwrap();
            assert!(
                mine.with_block(i + blocks as u32, |b| b == &a[..]).unwrap(),
                "block {i}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_without_a_cma_lane_opens_by_tcp() {
    let owner = connector("owner").await;
    let holder = connector("holder").await;
    let pool = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
    fill(&pool, 2, &block_bytes(3, 2));
    let g = owner
        .grant(&pool, GrantOptions::read().holder("holder"))
        .await
        .unwrap();
    let r = holder.open_grant(g.metadata()).await.unwrap();
    assert_eq!(r.lane(), GrantLane::Cma);
    let mut m = g.metadata().clone();
    m.cma = None;
    let r = holder.open_grant(&m).await.unwrap();
    assert_eq!(r.lane(), GrantLane::Tcp);
    let mine = Pool::allocate(BLOCK, BLOCK).unwrap();
    r.read_blocks(&[BlockRef::new(2, 0)], &mine, &[0])
        .await
        .unwrap();
    assert!(holds(&mine, 0, &block_bytes(3, 2)));
    // A grant that does not offer TCP reaches no further than cma.
    let cma_only = owner
        .grant(&pool, GrantOptions::read().holder("holder").tcp(false))
        .await
        .unwrap();
    assert!(cma_only.metadata().tcp.is_none());
    let e = holder
        .open_grant_via(cma_only.metadata(), GrantLane::Tcp)
        .await;
    assert!(
        matches!(e, Err(Error::Grant(GrantError::NoLane(_)))),
        "{e:?}"
    );
}

/// Reads from `s` until the owner closes it (what it sent before is
/// dropped); `false` if it stays open for 5 s.
fn closed_by_owner(s: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grant_frames_close_the_connection_and_move_nothing() {
    use ferry_proto::wire::{self, Hello, Message};
    // No secret: a raw socket speaks to the owner directly.
    let owner = Connector::builder()
        .worker_id("owner")
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap();
    let pool = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
    for i in 0..4 {
        fill(&pool, i, &[i as u8; BLOCK]);
    }
    let g = owner
        .grant(&pool, GrantOptions::read_write().bearer())
        .await
        .unwrap();
    let addr = g.metadata().tcp.as_ref().unwrap().addresses[0];
    let hello = Message::Hello(Hello {
        version: wire::PROTOCOL_VERSION,
        worker_id: "mallory".into(),
    })
    .to_vec();
    // A real request's frame, then broken in several ways.
    let good = Message::GrantRequest(wire::GrantRequest {
        req: 1,
        grant: g.id().0,
        token: g.metadata().token,
        kind: ferry_proto::OperationKind::Write,
        last: true,
        offset: 0,
        len: BLOCK as u32,
        blocks: vec![BlockRef::new(1, 0)],
        notify: None,
        bytes: vec![0xff; BLOCK],
    })
    .to_vec();
    let mut bad_flags = good.clone();
    bad_flags[8 + 33] = 0x80;
    let mut short_bytes = good.clone();
    short_bytes.truncate(good.len() - 1);
    let body = (short_bytes.len() - 8) as u32;
    short_bytes[4..8].copy_from_slice(&body.to_le_bytes());
    let mut oversize = good[..8].to_vec();
    oversize[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let reply = Message::GrantReply(wire::GrantReply {
        req: 1,
        answer: wire::GrantAnswer::Done,
    })
    .to_vec();
    let frames = tokio::task::spawn_blocking(move || {
        let mut closed = Vec::new();
        for frame in [bad_flags, short_bytes, oversize, reply] {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(&hello).unwrap();
            s.write_all(&frame).unwrap();
            closed.push(closed_by_owner(&mut s));
        }
        closed
    })
    .await
    .unwrap();
    assert_eq!(
        frames, [true; 4],
        "each malformed frame closes the connection"
    );
    assert!(
        (0..4).all(|i| all_are(&pool, i, i as u8)),
        "a malformed frame moved bytes"
    );
    // The owner still serves a well-formed holder.
    let holder = connector_plain("holder").await;
    let r = holder
        .open_grant_via(g.metadata(), GrantLane::Tcp)
        .await
        .unwrap();
    let mine = Pool::allocate(BLOCK, BLOCK).unwrap();
    r.read_blocks(&[BlockRef::new(2, 0)], &mine, &[0])
        .await
        .unwrap();
    assert!(all_are(&mine, 0, 2));
}

async fn connector_plain(worker: &str) -> Connector {
    Connector::builder()
        .worker_id(worker)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap()
}
