//! Standing grants on the same-host lane (cross-memory attach): one-sided
//! reads and writes by a holder in another process, notifications, the
//! revoke and retire fences, a holder killed mid-write, hostile grants, and
//! an owner that uses no CPU while idle.
//!
//! A test that crosses a process boundary runs this binary again as the
//! holder (`FERRY_GRANT_TEST_ROLE` names the role and carries the grant's
//! metadata); the holder prints tagged lines and reads its cues on stdin.

use std::time::{Duration, Instant};

use ferry::{
    BlockRef, Connector, Error, Grant, GrantError, GrantMetadata, GrantOptions, NotificationKind,
    Pool,
};

#[allow(dead_code)]
#[path = "support/spawned.rs"]
mod spawned;
#[allow(dead_code)]
#[path = "support/grant.rs"]
mod support;

use support::{all_are, block_bytes, cue, fill, holds, name, spec, tell, BLOCK};

use spawned::{runtime, Server};

const ROLE: &str = "FERRY_GRANT_TEST_ROLE";

async fn connector(worker: &str) -> Connector {
    Connector::builder()
        .worker_id(worker)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap()
}

/// The holder's side of every cross-process test (or, for `owner`, the
/// owner's).
fn holder(spec: &str) {
    if spec == "owner" {
        return owner_role();
    }
    let (role, json) = spec.split_once(' ').unwrap();
    let meta = GrantMetadata::from_json(json).unwrap();
    runtime().block_on(async move {
        let me = connector(role).await;
        let g = me.open_grant(&meta).await.unwrap();
        println!("OPEN");
        match role {
            "rw" => rw_holder(&g).await,
            "writers" => writers(g).await,
            "victim" => victim(&g).await,
            other => panic!("no role {other}"),
        }
    });
}

// ---------------------------------------------------------------------------
// READ and WRITE by index, notifications, generations.

async fn rw_holder(g: &ferry::RemoteGrant) {
    let local = Pool::allocate(16 * BLOCK, BLOCK).unwrap();
    // READ blocks 3, 4 and 9 of the owner into local 0, 1, 2.
    let refs = g.block_refs(&[3, 4, 9]).unwrap();
    g.read_blocks(&refs, &local, &[0, 1, 2]).await.unwrap();
    for (l, r) in [(0, 3), (1, 4), (2, 9)] {
        assert!(holds(&local, l, &block_bytes(1, r)), "block {r} read");
    }
    println!("READ ok");
    // WRITE local 5, 6 into the owner's 10, 11 (one notification), then
    // local 7 into 12 (a second).
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
    // The owner retires block 12: a write naming the old generation is
    // refused, and one naming the new one lands.
    assert_eq!(cue(), "retired");
    fill(&local, 8, &[0xee; BLOCK]);
    let stale = g.write_blocks(&local, &[8], &r, Some(b"stale")).await;
    println!("STALE {}", name(&stale));
    let fresh = g.block_refs(&[12]).unwrap();
    println!("GENERATION {}", fresh[0].generation);
    // Latency of 4 KiB one-sided operations (this build's profile).
    let n = 2000;
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
        "LATENCY 4KiB read p50 {:?} p99 {:?}, write p50 {:?} p99 {:?}",
        read.0, read.1, write.0, write.1
    );
    // Post -> owner notification: each write carries the monotonic clock
    // at its post; the owner (parked between them) compares on arrival.
    for _ in 0..NOTIFIED {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let at = monotonic_ns().to_le_bytes();
        g.write_blocks(&local, &[9], &one, Some(&at)).await.unwrap();
    }
    println!("DONE");
    assert_eq!(cue(), "");
}

async fn next(g: &Grant) -> ferry::Notification {
    tokio::time::timeout(Duration::from_secs(10), g.next_notification())
        .await
        .expect("a notification within 10 s")
        .expect("the grant lives")
}

/// Writes whose notification the owner times.
const NOTIFIED: usize = 200;

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the
/// host.
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn percentiles(t: &mut [Duration]) -> (Duration, Duration) {
    t.sort();
    (t[t.len() / 2], t[t.len() * 99 / 100])
}

#[test]
fn read_and_write_blocks_by_index_across_processes() {
    if spawned::served(ROLE, holder) {
        return;
    }
    let rt = runtime();
    rt.block_on(async {
        let owner = connector("owner").await;
        let pool = Pool::allocate(16 * BLOCK, BLOCK).unwrap();
        for i in 0..16 {
            fill(&pool, i, &block_bytes(1, i));
        }
        let g = owner
            .grant(&pool, GrantOptions::read_write().holder("rw"))
            .await
            .unwrap();
        let mut h = Server::start(
            "read_and_write_blocks_by_index_across_processes",
            ROLE,
            &spec("rw", &g),
        );
        h.after("OPEN");
        h.after("READ ok");
        h.after("WROTE");
        // The owner learns of both writes, in order, with their payloads.
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
        // Retire block 12: the holder's stale write is refused, typed, and
        // the block keeps its bytes.
        let fresh = g.retire(&[12]).await.unwrap();
        assert_eq!(fresh, vec![BlockRef::new(12, 1)]);
        tell(&mut h, "retired");
        assert_eq!(h.after("STALE "), "StaleGeneration");
        assert_eq!(h.after("GENERATION "), "1");
        assert!(holds(&pool, 12, &block_bytes(2, 7)), "a stale write landed");
        println!("holder: {}", h.after("LATENCY "));
        let mut lat = Vec::with_capacity(NOTIFIED);
        for i in 0..NOTIFIED {
            let n = next(&g).await;
            let now = monotonic_ns();
            assert_eq!(
                n.seq,
                3 + i as u64,
                "in order, the stale write not notified"
            );
            let sent = u64::from_le_bytes(n.payload[..8].try_into().unwrap());
            lat.push(Duration::from_nanos(now.saturating_sub(sent)));
        }
        let (p50, p99) = percentiles(&mut lat);
        println!(
            "post -> owner notification across processes, parked owner: p50 {p50:?} p99 {p99:?}"
        );
        h.after("DONE");
        assert!(
            g.try_next_notification().is_none(),
            "no notification for the stale write"
        );
        drop(h);
    });
}

// ---------------------------------------------------------------------------
// Revoke during 1,000 concurrent writes.

const WRITERS: u32 = 8;
const WRITES: u32 = 1000;
/// Blocks of 256 KiB: each write copies for tens of microseconds, so that
/// some are in flight when the revoke comes.
const WBLOCK: usize = 256 << 10;

async fn writers(g: ferry::RemoteGrant) {
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
            // Each writer: blocks w, w+8, w+16... of the owner, in turn.
            let (mut revoked, mut other, mut after_revoked_ok) = (0u32, 0u32, 0u32);
            for k in 0..WRITES / WRITERS {
                let index = w + WRITERS * (k % 8);
                let r = [BlockRef::new(index, 0)];
                match g.write_blocks(&local, &[w], &r, None).await {
                    Ok(()) if revoked > 0 => after_revoked_ok += 1,
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
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (revoked, other, after_revoked_ok)
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
    // After the owner filled its blocks with the sentinel: try again.
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
fn no_byte_lands_after_revoke_during_concurrent_writes() {
    if spawned::served(ROLE, holder) {
        return;
    }
    let rt = runtime();
    rt.block_on(async {
        let owner = connector("owner").await;
        let blocks = 64u32;
        let pool = Pool::allocate(blocks as usize * WBLOCK, WBLOCK).unwrap();
        let g = owner
            .grant(&pool, GrantOptions::write().holder("writers"))
            .await
            .unwrap();
        let mut h = Server::start(
            "no_byte_lands_after_revoke_during_concurrent_writes",
            ROLE,
            &spec("writers", &g),
        );
        h.after("OPEN");
        h.after("QUARTER");
        g.revoke().await.unwrap();
        // From here on no byte may land: fill with the sentinel.
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
        assert!(
            ok >= WRITES / 4 && revoked > 0,
            "the revoke came mid-way: {totals}"
        );
        assert_eq!(
            (other, late),
            (0, 0),
            "every write after the revoke failed Revoked: {totals}"
        );
        tell(&mut h, "filled");
        assert_eq!(h.after("AGAIN "), "Revoked");
        // The writers had time to try: still the sentinel everywhere.
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

async fn victim(g: &ferry::RemoteGrant) {
    // 16 blocks of 64 KiB: 1 MiB a write, copied on a blocking thread.
    let local = Pool::allocate(16 * 65536, 65536).unwrap();
    for i in 0..16 {
        local.with_block_mut(i, |b| b.fill(0xcc)).unwrap();
    }
    let ids: Vec<u32> = (0..16).collect();
    let refs = g.block_refs(&ids).unwrap();
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
fn a_holder_killed_mid_write_leaves_the_owner_intact() {
    if spawned::served(ROLE, holder) {
        return;
    }
    let rt = runtime();
    rt.block_on(async {
        let owner = connector("owner").await;
        let bs = 65536;
        let pool = Pool::allocate(32 * bs, bs).unwrap();
        for i in 16..32 {
            pool.with_block_mut(i, |b| b.fill(i as u8)).unwrap();
        }
        let doomed = owner
            .grant(
                &pool,
                GrantOptions::write()
                    .holder("victim")
                    .revoke_deadline(Duration::from_secs(10)),
            )
            .await
            .unwrap();
        let other = owner
            .grant(&pool, GrantOptions::read_write().bearer())
            .await
            .unwrap();
        let mut h = Server::start(
            "a_holder_killed_mid_write_leaves_the_owner_intact",
            ROLE,
            &spec("victim", &doomed),
        );
        h.after("WRITING");
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.child.kill().unwrap();
        // Not reaped yet: a zombie, which counts as gone.
        let t = Instant::now();
        doomed.revoke().await.unwrap();
        let took = t.elapsed();
        assert!(took < Duration::from_millis(500), "revoke took {took:?}");
        let _ = h.child.wait();
        // The owner's other blocks are intact...
        for i in 16..32 {
            assert!(all_are(&pool, i, i as u8), "block {i} changed");
        }
        // ...and the other grant on the same pool works, on every block.
        let holder = connector("other").await;
        let og = holder.open_grant(other.metadata()).await.unwrap();
        let mine = Pool::allocate(2 * bs, bs).unwrap();
        mine.with_block_mut(0, |b| b.fill(0x42)).unwrap();
        let r = og.block_refs(&[3, 20]).unwrap();
        og.write_blocks(&mine, &[0], &r[..1], None).await.unwrap();
        og.read_blocks(&r[1..], &mine, &[1]).await.unwrap();
        assert!(all_are(&pool, 3, 0x42));
        assert!(all_are(&mine, 1, 20));
        drop(h);
    });
}

// ---------------------------------------------------------------------------
// An owner that died.

fn owner_role() {
    runtime().block_on(async {
        let me = connector("owner").await;
        let pool = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
        fill(&pool, 2, &[0x77; BLOCK]);
        let g = me
            .grant(&pool, GrantOptions::read_write().bearer())
            .await
            .unwrap();
        println!("GRANT {}", g.metadata().to_json().unwrap());
        assert_eq!(cue(), "");
    });
}

#[test]
fn an_owner_that_died_is_reported_gone() {
    if spawned::served(ROLE, holder) {
        return;
    }
    let rt = runtime();
    rt.block_on(async {
        let mut owner = Server::start("an_owner_that_died_is_reported_gone", ROLE, "owner");
        let meta = GrantMetadata::from_json(&owner.after("GRANT ")).unwrap();
        let me = connector("holder").await;
        let g = me.open_grant(&meta).await.unwrap();
        let local = Pool::allocate(2 * BLOCK, BLOCK).unwrap();
        let r = g.block_refs(&[2]).unwrap();
        g.read_blocks(&r, &local, &[0]).await.unwrap();
        assert!(all_are(&local, 0, 0x77));
        owner.child.kill().unwrap();
        owner.child.wait().unwrap();
        for res in [
            g.read_blocks(&r, &local, &[1]).await,
            g.write_blocks(&local, &[0], &r, Some(b"late")).await,
        ] {
            assert!(
                matches!(res, Err(Error::Grant(GrantError::OwnerGone(_)))),
                "{res:?}"
            );
        }
        assert!(all_are(&local, 1, 0), "nothing was read from a dead owner");
        drop(owner);
    });
}

// ---------------------------------------------------------------------------
// Hostile grants.

#[test]
fn hostile_grants_are_refused_typed_and_move_no_byte() {
    let rt = runtime();
    rt.block_on(async {
        let owner = connector("owner").await;
        let bob = connector("bob").await;
        // 10 blocks of memory; the pool (and the grants) cover 1 to 8, so
        // blocks 0 and 9 are guards that no grant covers.
        let mut big = vec![0x11u8; 10 * BLOCK];
        let ptr = big.as_mut_ptr();
        // SAFETY: the vector's buffer lives as long as the pool (it is the
        // pool's owner; moving the vector does not move it); the pool
        // covers bytes 4096 to 36864 of it, and the guards are only read
        // below, while nothing writes them.
        let pool = unsafe {
            Pool::from_raw_parts(
                ptr.add(BLOCK),
                8 * BLOCK,
                BLOCK,
                ferry::Device::CPU,
                true,
                big,
            )
        }
        .unwrap();
        let guards = || -> bool {
            // SAFETY: blocks 0 and 9 of the buffer the pool keeps alive.
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts(ptr, BLOCK),
                    std::slice::from_raw_parts(ptr.add(9 * BLOCK), BLOCK),
                )
            };
            a.iter().chain(b).all(|&x| x == 0x11)
        };
        for i in 0..8 {
            fill(&pool, i, &block_bytes(3, i));
        }
        let intact = |pool: &Pool| (0..8).all(|i| holds(pool, i, &block_bytes(3, i)));
        let g = owner
            .grant(&pool, GrantOptions::read().holder("bob"))
            .await
            .unwrap();
        let real = g.metadata().clone();
        let grant_err = |r: ferry::Result<ferry::RemoteGrant>| match r {
            Err(Error::Grant(e)) => e,
            Err(e) => panic!("untyped: {e}"),
            Ok(_) => panic!("opened"),
        };
        // Forged secrets and tampered shapes.
        let mut m = real.clone();
        m.token = ferry_proto_token([9; 16]);
        assert_eq!(
            grant_err(bob.open_grant(&m).await),
            GrantError::Forged { what: "token" }
        );
        let mut m = real.clone();
        m.cma.as_mut().unwrap().cookie[0] ^= 1;
        assert_eq!(
            grant_err(bob.open_grant(&m).await),
            GrantError::Forged { what: "cookie" }
        );
        let mut m = real.clone();
        m.cma.as_mut().unwrap().base -= BLOCK as u64;
        assert!(matches!(
            grant_err(bob.open_grant(&m).await),
            GrantError::Forged { .. }
        ));
        let mut m = real.clone();
        m.block_count += 1;
        assert!(matches!(
            grant_err(bob.open_grant(&m).await),
            GrantError::Forged { .. }
        ));
        let mut m = real.clone();
        m.rights = ferry::Rights::READ_WRITE;
        assert!(matches!(
            grant_err(bob.open_grant(&m).await),
            GrantError::Forged { .. }
        ));
        let mut m = real.clone();
        m.cma.as_mut().unwrap().control_fd = 0;
        // (By cma only: where it does not reach, open_grant falls back to
        // TCP, whose refusals `grant_tcp.rs` tests.)
        assert!(matches!(
            grant_err(bob.open_grant_via(&m, ferry::GrantLane::Cma).await),
            GrantError::Forged { .. } | GrantError::NoLane(_)
        ));
        let mut m = real.clone();
        m.cma.as_mut().unwrap().control_fd = 1 << 20;
        assert_eq!(grant_err(bob.open_grant(&m).await), GrantError::Revoked);
        let mut m = real.clone();
        m.host_id = "another-host".into();
        assert!(matches!(
            grant_err(bob.open_grant_via(&m, ferry::GrantLane::Cma).await),
            GrantError::NoLane(_)
        ));
        // Another worker's.
        let eve = connector("eve").await;
        assert!(matches!(
            grant_err(eve.open_grant(&real).await),
            GrantError::NotYours { .. }
        ));
        // The real one opens; then out-of-range indices, missing rights,
        // mismatched shapes and oversize notifications are refused.
        let h = bob.open_grant(&real).await.unwrap();
        let local = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
        for i in 0..4 {
            fill(&local, i, &[0xdd; BLOCK]);
        }
        let e = |r: ferry::Result<()>| match r {
            Err(Error::Grant(e)) => e,
            other => panic!("{other:?}"),
        };
        for index in [8, 9, u32::MAX] {
            assert_eq!(
                e(h.read_blocks(&[BlockRef::new(index, 0)], &local, &[0])
                    .await),
                GrantError::OutOfRange { index, count: 8 }
            );
        }
        assert!(matches!(
            e(h.write_blocks(&local, &[0], &[BlockRef::new(1, 0)], None)
                .await),
            GrantError::RightsMissing { .. }
        ));
        assert!(matches!(
            e(
                h.write_blocks(&local, &[0], &[BlockRef::new(1, 0)], Some(&[0; 257]))
                    .await
            ),
            GrantError::NotificationTooLarge { len: 257, max: 256 }
        ));
        let small = Pool::allocate(4 * 1024, 1024).unwrap();
        assert!(matches!(
            e(h.read_blocks(&[BlockRef::new(1, 0)], &small, &[0]).await),
            GrantError::LengthMismatch { .. }
        ));
        assert!(matches!(
            e(
                h.read_blocks(&[BlockRef::new(1, 0), BlockRef::new(2, 0)], &local, &[0])
                    .await
            ),
            GrantError::LengthMismatch { .. }
        ));
        // A second holder of the same grant is refused.
        assert!(matches!(
            grant_err(bob.open_grant(&real).await),
            GrantError::Claimed { .. }
        ));
        // A WRITE grant: oversize notification and out-of-range writes.
        let w = owner
            .grant(&pool, GrantOptions::write().bearer())
            .await
            .unwrap();
        let wh = bob.open_grant(w.metadata()).await.unwrap();
        assert!(matches!(
            e(
                wh.write_blocks(&local, &[0], &[BlockRef::new(2, 0)], Some(&[1; 300]))
                    .await
            ),
            GrantError::NotificationTooLarge { .. }
        ));
        assert!(matches!(
            e(wh.write_blocks(&local, &[0], &[BlockRef::new(8, 0)], None)
                .await),
            GrantError::OutOfRange { .. }
        ));
        assert!(matches!(
            e(wh.write_blocks(&local, &[0], &[BlockRef::new(2, 7)], None)
                .await),
            GrantError::StaleGeneration { .. }
        ));
        // Revoked: the open grant and a fresh open are refused.
        w.revoke().await.unwrap();
        assert_eq!(
            e(wh.write_blocks(&local, &[0], &[BlockRef::new(2, 0)], None)
                .await),
            GrantError::Revoked
        );
        assert_eq!(
            grant_err(bob.open_grant(w.metadata()).await),
            GrantError::Revoked
        );
        // Expired.
        let x = owner
            .grant(
                &pool,
                GrantOptions::write()
                    .bearer()
                    .expires_after(Duration::from_millis(100)),
            )
            .await
            .unwrap();
        let xh = bob.open_grant(x.metadata()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(matches!(
            e(xh.write_blocks(&local, &[0], &[BlockRef::new(2, 0)], None)
                .await),
            GrantError::Expired { .. }
        ));
        assert!(matches!(
            grant_err(bob.open_grant(x.metadata()).await),
            GrantError::Expired { .. }
        ));
        // Not one byte moved, in the pool or around it.
        assert!(intact(&pool), "a refused operation moved bytes");
        assert!(guards(), "bytes outside the granted range moved");
        drop((h, wh, xh, g, w, x));
    });
}

fn ferry_proto_token(b: [u8; 16]) -> ferry_proto::Token {
    ferry_proto::Token::from_bytes(b)
}

// ---------------------------------------------------------------------------
// Event-driven notifications.

/// CPU time of this process's thread named `name`, in nanoseconds
/// (`schedstat`: the scheduler's own count), if there is one.
fn thread_cpu(name: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let s = std::fs::read_to_string(dir.join("schedstat")).ok()?;
            return s.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

#[test]
fn an_idle_owner_uses_no_cpu_and_wakes_on_a_notification() {
    let rt = runtime();
    rt.block_on(async {
        let owner = connector("owner").await;
        let bob = connector("bob").await;
        let pool = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
        let g = owner
            .grant(&pool, GrantOptions::write().holder("bob"))
            .await
            .unwrap();
        let thread = format!("ferry-grant-{}", g.id().0);
        let h = bob.open_grant(g.metadata()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = thread_cpu(&thread).expect("the owner's notification thread");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = thread_cpu(&thread).unwrap() - before;
        assert!(
            idle < 20_000_000,
            "the idle owner thread used {idle} ns of CPU in 1 s"
        );
        // Parked, it still wakes at once for a notification.
        let local = Pool::allocate(BLOCK, BLOCK).unwrap();
        let t = Instant::now();
        h.write_blocks(&local, &[0], &[BlockRef::new(1, 0)], Some(b"hi"))
            .await
            .unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), g.next_notification())
            .await
            .unwrap()
            .unwrap();
        println!(
            "post -> owner notification (parked owner): {:?}",
            t.elapsed()
        );
        assert_eq!(n.payload, b"hi");
        // With a spin, the same.
        let s = owner
            .grant(
                &pool,
                GrantOptions::write()
                    .holder("bob")
                    .spin(Duration::from_micros(200)),
            )
            .await
            .unwrap();
        let sh = bob.open_grant(s.metadata()).await.unwrap();
        let t = Instant::now();
        sh.write_blocks(&local, &[0], &[BlockRef::new(2, 0)], Some(b"spun"))
            .await
            .unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), s.next_notification())
            .await
            .unwrap()
            .unwrap();
        println!(
            "post -> owner notification (spinning owner): {:?}",
            t.elapsed()
        );
        assert_eq!((n.first_block, &n.payload[..]), (2, &b"spun"[..]));
    });
}
