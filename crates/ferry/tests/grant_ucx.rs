//! Standing grants on the UCX lane, over UCX's TCP transport
//! (`UCX_TLS=tcp`, set here before UCX loads): READ and WRITE of blocks
//! by index between two processes with the grant's remote keys, the
//! notification, a retired generation refused, revoke, and hostile
//! metadata refused typed. Over TCP, UCX emulates gets and puts with
//! messages the owner's grant worker answers (no RDMA NIC here: RDMA is
//! unverified). Skipped, saying why, where `libucp` does not load.
//!
//! A test that crosses a process boundary runs this binary again as the
//! holder (`FERRY_GRANT_UCX_ROLE` carries the grant's metadata).

use std::sync::Once;
use std::time::{Duration, Instant};

use ferry::{BlockRef, Connector, Error, Grant, GrantError, GrantMetadata, GrantOptions, Pool};

#[allow(dead_code)]
#[path = "support/spawned.rs"]
mod spawned;
#[allow(dead_code)]
#[path = "support/grant.rs"]
mod support;

use support::{block_bytes, cue, fill, holds, name, tell, BLOCK};

use spawned::{runtime, Server};

const ROLE: &str = "FERRY_GRANT_UCX_ROLE";

/// UCX over TCP only, in this process and the holders it starts; `false`
/// (and a line saying why) where UCX does not load.
fn ucx_here() -> bool {
    static TCP: Once = Once::new();
    TCP.call_once(|| {
        if std::env::var_os("UCX_TLS").is_none() {
            std::env::set_var("UCX_TLS", "tcp");
        }
    });
    match ferry::ucx::status() {
        Ok(found) => {
            eprintln!("UCX: {found}");
            true
        }
        Err(why) => {
            eprintln!("skipped: no UCX here ({why})");
            false
        }
    }
}

async fn connector(worker: &str) -> Connector {
    Connector::builder()
        .worker_id(worker)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap()
}

fn ucx_grant() -> GrantOptions {
    GrantOptions::read_write().ucx(true).cma(false)
}

fn percentiles(t: &mut [Duration]) -> (Duration, Duration) {
    t.sort();
    (t[t.len() / 2], t[t.len() * 99 / 100])
}

/// The holder process.
fn holder(spec: &str) {
    let (role, json) = spec.split_once(' ').unwrap();
    let meta = GrantMetadata::from_json(json).unwrap();
    runtime().block_on(async move {
        let me = connector(role).await;
        let g = me.open_grant(&meta).await.unwrap();
        println!("OPEN {:?}", g.lane());
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
        let r12 = g.block_refs(&[12]).unwrap();
        g.write_blocks(&local, &[7], &r12, Some(b"second"))
            .await
            .unwrap();
        println!("WROTE");
        assert_eq!(cue(), "retired");
        fill(&local, 8, &[0xee; BLOCK]);
        let stale = g.write_blocks(&local, &[8], &r12, None).await;
        println!("STALE {}", name(&stale));
        println!("GENERATION {}", g.block_refs(&[12]).unwrap()[0].generation);
        // 4 KiB one-sided operations, timed (this build's profile).
        let n = 300;
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
        // After the revoke: every operation refused, typed; nothing lands.
        assert_eq!(cue(), "revoked");
        let t = Instant::now();
        let late = g.block_refs(&[13]);
        eprintln!("holder: refs after revoke {:?}: {late:?}", t.elapsed());
        println!("REFS {}", name(&late));
        let r13 = [BlockRef::new(13, 0)];
        let read = g.read_blocks(&r13, &local, &[0]).await;
        fill(&local, 1, &[0xee; BLOCK]);
        let write = g.write_blocks(&local, &[1], &r13, Some(b"late")).await;
        println!("AFTER {} {}", name(&read), name(&write));
        println!("REVOKED {}", g.is_revoked());
        assert_eq!(cue(), "");
    });
}

#[test]
fn read_write_retire_revoke_over_ucx_across_processes() {
    if spawned::served(ROLE, holder) || !ucx_here() {
        return;
    }
    runtime().block_on(async {
        let owner = connector("owner").await;
        let pool = Pool::allocate(16 * BLOCK, BLOCK).unwrap();
        for i in 0..16 {
            fill(&pool, i, &block_bytes(1, i));
        }
        let g = owner.grant(&pool, ucx_grant().holder("rw")).await.unwrap();
        let json = g.metadata().to_json().unwrap();
        assert!(json.len() <= 1024 && g.metadata().cma.is_none());
        eprintln!("metadata: {} bytes", json.len());
        let mut h = Server::start(
            "read_write_retire_revoke_over_ucx_across_processes",
            ROLE,
            &format!("rw {json}"),
        );
        assert_eq!(h.after("OPEN "), "Ucx");
        h.after("READ ok");
        h.after("WROTE");
        let n1 = next(&g).await;
        let n2 = next(&g).await;
        assert_eq!(
            (n1.seq, n1.first_block, n1.block_count, &n1.payload[..]),
            (1, 10, 2, &b"first"[..])
        );
        assert_eq!(
            (n2.seq, n2.first_block, n2.block_count, &n2.payload[..]),
            (2, 12, 1, &b"second"[..])
        );
        for (r, l) in [(10, 5), (11, 6), (12, 7)] {
            assert!(holds(&pool, r, &block_bytes(2, l)), "block {r} written");
        }
        for i in (0..10).chain(13..15) {
            assert!(holds(&pool, i, &block_bytes(1, i)), "block {i} untouched");
        }
        let fresh = g.retire(&[12]).await.unwrap();
        assert_eq!(fresh, vec![BlockRef::new(12, 1)]);
        tell(&mut h, "retired");
        assert_eq!(h.after("STALE "), "StaleGeneration");
        assert_eq!(h.after("GENERATION "), "1");
        assert!(holds(&pool, 12, &block_bytes(2, 7)), "a stale write landed");
        eprintln!(
            "holder (debug build, UCX over TCP): {}",
            h.after("LATENCY ")
        );
        let t = Instant::now();
        g.revoke().await.unwrap();
        eprintln!("revoked in {:?}", t.elapsed());
        let before = pool.with_block(13, <[u8]>::to_vec).unwrap();
        tell(&mut h, "revoked");
        let refs = h.after("REFS ");
        let after = h.after("AFTER ");
        let (read, write) = after.split_once(' ').unwrap();
        eprintln!("after revoke: refs {refs}, read {read}, write {write}");
        assert!(read != "ok" && !read.starts_with("other"), "{read}");
        assert!(write != "ok" && !write.starts_with("other"), "{write}");
        assert_eq!(h.after("REVOKED "), "true");
        assert!(holds(&pool, 13, &before), "a byte landed after revoke");
        assert!(g.try_next_notification().is_none(), "a late notification");
    });
}

async fn next(g: &Grant) -> ferry::Notification {
    tokio::time::timeout(Duration::from_secs(10), g.next_notification())
        .await
        .expect("a notification within 10 s")
        .expect("the grant lives")
}

/// Edits the ucx section's hex field `field` of `json` with `edit`.
fn edit_ucx(json: &str, field: &str, edit: impl FnOnce(&str) -> String) -> String {
    let key = format!("\"{field}\":\"");
    let at = json.rfind(&key).unwrap() + key.len();
    let end = at + json[at..].find('"').unwrap();
    format!("{}{}{}", &json[..at], edit(&json[at..end]), &json[end..])
}

#[test]
fn hostile_ucx_grants_are_refused_typed() {
    if !ucx_here() {
        return;
    }
    runtime().block_on(async {
        let owner = connector("owner").await;
        let holder = connector("h").await;
        let pool = Pool::allocate(8 * BLOCK, BLOCK).unwrap();
        let g = owner.grant(&pool, ucx_grant().bearer()).await.unwrap();
        let other = owner.grant(&pool, ucx_grant().bearer()).await.unwrap();
        let json = g.metadata().to_json().unwrap();
        // Forged key bytes: one digit changed.
        let forged = edit_ucx(&json, "rkey", |k| {
            let flip = if k.starts_with('0') { "1" } else { "0" };
            format!("{flip}{}", &k[1..])
        });
        let m = GrantMetadata::from_json(&forged).unwrap();
        let r = holder.open_grant(&m).await;
        assert!(
            matches!(r, Err(Error::Grant(GrantError::Forged { .. }))),
            "{r:?}"
        );
        // Another grant's worker address.
        let theirs = other.metadata().ucx.as_ref().unwrap().address.clone();
        let mut m = GrantMetadata::from_json(&json).unwrap();
        m.ucx.as_mut().unwrap().address = theirs;
        let r = holder.open_grant(&m).await;
        assert!(
            matches!(r, Err(Error::Grant(GrantError::Forged { .. }))),
            "{r:?}"
        );
        // Truncated or not hex: malformed, typed, before UCX sees it.
        let cut = edit_ucx(&json, "address", |a| a[..a.len() - 1].to_string());
        assert!(matches!(
            GrantMetadata::from_json(&cut),
            Err(GrantError::Malformed(_))
        ));
        // The real one opens over UCX; out-of-range blocks are refused.
        let r = holder.open_grant(&g.metadata().clone()).await.unwrap();
        assert_eq!(r.lane(), ferry::GrantLane::Ucx);
        let local = Pool::allocate(2 * BLOCK, BLOCK).unwrap();
        let out = r.read_blocks(&[BlockRef::new(8, 0)], &local, &[0]).await;
        assert!(matches!(
            out,
            Err(Error::Grant(GrantError::OutOfRange { index: 8, count: 8 }))
        ));
        assert!(matches!(
            r.generation(99),
            Err(Error::Grant(GrantError::OutOfRange { .. }))
        ));
        // A read-only grant refuses a write.
        let ro = owner
            .grant(&pool, GrantOptions::read().ucx(true).cma(false).bearer())
            .await
            .unwrap();
        let ro = holder.open_grant(ro.metadata()).await.unwrap();
        let w = ro
            .write_blocks(&local, &[0], &[BlockRef::new(0, 0)], None)
            .await;
        assert!(matches!(
            w,
            Err(Error::Grant(GrantError::RightsMissing { .. }))
        ));
        // Revoked before it was opened: refused, typed.
        other.revoke().await.unwrap();
        let r = holder.open_grant(other.metadata()).await;
        eprintln!("opening a revoked UCX grant: {}", name(&r));
        assert!(matches!(
            r,
            Err(Error::Grant(
                GrantError::OwnerGone(_) | GrantError::Revoked | GrantError::NoLane(_)
            ))
        ));
    });
}

/// Whether UCX over this transport refuses a get through the key of
/// memory that was unregistered (as an RDMA NIC does): printed, not
/// asserted; the grant does not rely on it (its revoke also shuts the
/// grant's worker down).
#[test]
fn what_ucx_does_with_a_key_of_unregistered_memory() {
    use ferry::ucx::baseline::{Lent, Node};
    if !ucx_here() {
        return;
    }
    runtime().block_on(async {
        let (a, b) = (Node::start().unwrap(), Node::start().unwrap());
        let mut lent = Lent::new(4096, 1).unwrap();
        let mut g = b.connect(&lent.offer(&a)).unwrap();
        eprintln!("lanes: {:?}", g.lanes());
        let (back, first) = tokio::task::spawn_blocking(move || {
            let r = g.run(1).map(|_| ());
            (g, r)
        })
        .await
        .unwrap();
        assert!(first.is_ok(), "{first:?}");
        lent.unregister();
        let mut g = back;
        let after = tokio::task::spawn_blocking(move || g.run(1).map(|_| ()))
            .await
            .unwrap();
        eprintln!("UCX: a get through the key of unregistered memory: {after:?}");
    });
}
