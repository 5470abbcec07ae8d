//! Offers: one pool offered to any number of workers, each of which
//! claims a grant of its own from the owner's runtime, bound to its
//! authenticated worker id. Across processes, over cross-memory attach and
//! over TCP: two claimers write with notifications the owner sees with
//! the right holder, read the owner's bytes, one holder's grant revoked
//! alone, then the offer revoked for all. In one process: claims with a
//! wrong token, on an unknown, expired, revoked or dropped offer refused
//! typed; a second claim replaces the first grant.

use std::time::Duration;

use ferry::{
    Connector, Error, GrantError, GrantLane, Offer, OfferMetadata, OfferOptions, Pool, RemoteGrant,
};

#[allow(dead_code)]
#[path = "support/spawned.rs"]
mod spawned;
#[allow(dead_code)]
#[path = "support/grant.rs"]
mod support;

use support::{block_bytes, cue, fill, holds, name, tell, BLOCK};

use spawned::{runtime, Server};

const ROLE: &str = "FERRY_GRANT_OFFER_TEST_ROLE";
const SECRET: &str = "grant-offer-test-secret";

async fn connector(worker: &str) -> Connector {
    Connector::builder()
        .worker_id(worker)
        .secret(SECRET)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap()
}

fn lane_of(s: &str) -> GrantLane {
    match s {
        "cma" => GrantLane::Cma,
        "tcp" => GrantLane::Tcp,
        other => panic!("no lane {other}"),
    }
}

/// The block claimer `w` (1 or 2) writes into, and the one it reads.
fn blocks_of(w: u32) -> (u32, u32) {
    (10 + w, w)
}

/// A claimer process: `<worker> <lane> <offer json>`.
fn claimer(spec: &str) {
    let mut parts = spec.splitn(3, ' ');
    let (worker, lane, json) = (
        parts.next().unwrap().to_string(),
        lane_of(parts.next().unwrap()),
        parts.next().unwrap(),
    );
    let w: u32 = worker[1..].parse().unwrap();
    let offer = OfferMetadata::from_json(json).unwrap();
    runtime().block_on(async move {
        let me = connector(&worker).await;
        let g = me.claim_via(&offer, lane).await.unwrap();
        assert_eq!(g.lane(), lane);
        assert_eq!(g.metadata().holder.as_deref(), Some(worker.as_str()));
        let local = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
        let (into, from) = blocks_of(w);
        g.read_blocks(&g.block_refs(&[from]).unwrap(), &local, &[0])
            .await
            .unwrap();
        assert!(holds(&local, 0, &block_bytes(1, from)), "block {from} read");
        fill(&local, 1, &block_bytes(2, w));
        let r = g.block_refs(&[into]).unwrap();
        g.write_blocks(&local, &[1], &r, Some(worker.as_bytes()))
            .await
            .unwrap();
        println!("WROTE");
        loop {
            match cue().as_str() {
                "write" => {
                    let r = write_again(&g, &local, into).await;
                    println!("WRITE {}", name(&r));
                }
                "claim" => {
                    let r = me.claim_via(&offer, lane).await;
                    println!("CLAIM {}", name(&r));
                }
                _ => return,
            }
        }
    });
}

async fn write_again(g: &RemoteGrant, local: &Pool, into: u32) -> ferry::Result<()> {
    let r = g.block_refs(&[into])?;
    g.write_blocks(local, &[1], &r, Some(b"again")).await
}

async fn next(o: &Offer) -> ferry::Notification {
    tokio::time::timeout(Duration::from_secs(10), o.next_notification())
        .await
        .expect("a notification within 10 s")
        .expect("the offer lives")
}

fn two_claimers(test: &str, lane: &str) {
    if spawned::served(ROLE, claimer) {
        return;
    }
    runtime().block_on(async {
        let owner = connector("owner").await;
        let pool = Pool::allocate(16 * BLOCK, BLOCK).unwrap();
        for i in 0..16 {
            fill(&pool, i, &block_bytes(1, i));
        }
        let offer = owner.offer(&pool, OfferOptions::read_write()).unwrap();
        let json = offer.metadata().to_json().unwrap();
        assert!(json.len() <= 1024);
        let mut w1 = Server::start(test, ROLE, &format!("w1 {lane} {json}"));
        let mut w2 = Server::start(test, ROLE, &format!("w2 {lane} {json}"));
        w1.after("WROTE");
        w2.after("WROTE");
        // Each write's notification names the worker that made it.
        let mut seen = Vec::new();
        for _ in 0..2 {
            let n = next(&offer).await;
            assert_eq!(n.holder.as_deref().map(str::as_bytes), Some(&n.payload[..]));
            seen.push(n.holder.unwrap());
        }
        seen.sort();
        assert_eq!(seen, ["w1", "w2"]);
        assert_eq!(offer.holders(), ["w1", "w2"]);
        for w in [1, 2] {
            let (into, _) = blocks_of(w);
            assert!(holds(&pool, into, &block_bytes(2, w)), "w{w}'s write");
        }
        assert!(offer.poll_notification().is_none());

        // One holder's grant revoked: its writes and claims are refused,
        // the other's go on.
        offer.revoke_holder("w1").await.unwrap();
        assert_eq!(offer.holders(), ["w2"]);
        fill(&pool, 11, &[0x11; BLOCK]);
        tell(&mut w1, "write");
        assert_eq!(w1.after("WRITE "), "Revoked");
        tell(&mut w1, "claim");
        assert_eq!(w1.after("CLAIM "), "Revoked");
        assert!(support::all_are(&pool, 11, 0x11), "a revoked holder wrote");
        tell(&mut w2, "write");
        assert_eq!(w2.after("WRITE "), "ok");
        let n = next(&offer).await;
        assert_eq!(
            (n.holder.as_deref(), &n.payload[..]),
            (Some("w2"), &b"again"[..])
        );

        // The offer revoked: every grant ends, and claims are refused.
        offer.revoke().await.unwrap();
        assert!(offer.holders().is_empty());
        fill(&pool, 12, &[0x12; BLOCK]);
        tell(&mut w2, "write");
        assert_eq!(w2.after("WRITE "), "Revoked");
        tell(&mut w2, "claim");
        assert_eq!(w2.after("CLAIM "), "Revoked");
        assert!(
            support::all_are(&pool, 12, 0x12),
            "a write after revoke landed"
        );
        assert!(offer.next_notification().await.is_none());
    });
}

#[test]
fn two_claimers_each_get_their_own_grant_over_cma() {
    two_claimers("two_claimers_each_get_their_own_grant_over_cma", "cma");
}

#[test]
fn two_claimers_each_get_their_own_grant_over_tcp() {
    two_claimers("two_claimers_each_get_their_own_grant_over_tcp", "tcp");
}

fn refused<T>(r: ferry::Result<T>) -> GrantError {
    match r {
        Err(Error::Grant(e)) => e,
        Err(e) => panic!("not a grant error: {e}"),
        Ok(_) => panic!("not refused"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_claims_are_refused_typed() {
    let owner = connector("owner").await;
    let me = connector("claimer").await;
    let pool = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
    let offer = owner.offer(&pool, OfferOptions::read()).unwrap();
    let meta = offer.metadata().clone();

    // A wrong token, or an offer the owner does not have: forged, and the
    // same refusal for both (nothing told of other offers).
    let mut forged = meta.clone();
    forged.token = ferry_proto::Token::from_bytes([7; 16]);
    assert_eq!(
        refused(me.claim_via(&forged, GrantLane::Tcp).await),
        GrantError::Forged { what: "token" }
    );
    let mut unknown = meta.clone();
    unknown.offer = ferry::grant::OfferId(u64::MAX);
    assert_eq!(
        refused(me.claim_via(&unknown, GrantLane::Tcp).await),
        GrantError::Forged { what: "token" }
    );
    assert!(offer.holders().is_empty());

    // A claim gets a READ grant bound to the claimer; a WRITE is refused.
    let g = me.claim_via(&meta, GrantLane::Tcp).await.unwrap();
    assert_eq!(offer.holders(), ["claimer"]);
    let local = Pool::allocate(2 * BLOCK, BLOCK).unwrap();
    let r = g.block_refs(&[1]).unwrap();
    g.read_blocks(&r, &local, &[0]).await.unwrap();
    assert!(matches!(
        refused(g.write_blocks(&local, &[0], &r, None).await),
        GrantError::RightsMissing { .. }
    ));
    // Claiming again: a fresh grant, which replaces the first.
    let again = me.claim_via(&meta, GrantLane::Tcp).await.unwrap();
    assert_ne!(again.metadata().grant, g.metadata().grant);
    assert_eq!(
        refused(g.read_blocks(&r, &local, &[0]).await),
        GrantError::Revoked
    );
    again.read_blocks(&r, &local, &[0]).await.unwrap();
    assert_eq!(offer.holders(), ["claimer"]);

    // Revoked: the grant ends, claims are refused.
    offer.revoke().await.unwrap();
    assert_eq!(
        refused(again.read_blocks(&r, &local, &[0]).await),
        GrantError::Revoked
    );
    assert_eq!(refused(me.claim(&meta).await), GrantError::Revoked);
    // Dropped: the same.
    let dropped = owner.offer(&pool, OfferOptions::read()).unwrap();
    let dmeta = dropped.metadata().clone();
    let dg = me.claim_via(&dmeta, GrantLane::Tcp).await.unwrap();
    drop(dropped);
    assert_eq!(refused(me.claim(&dmeta).await), GrantError::Revoked);
    assert_eq!(
        refused(dg.read_blocks(&r, &local, &[0]).await),
        GrantError::Revoked
    );

    // Expired: the offer, and the grants made from it.
    let brief = owner
        .offer(
            &pool,
            OfferOptions::read().expires_after(Duration::from_millis(300)),
        )
        .unwrap();
    let bg = me
        .claim_via(brief.metadata(), GrantLane::Tcp)
        .await
        .unwrap();
    assert!(bg.metadata().expires_at_ms <= brief.metadata().expires_at_ms);
    let waiting = tokio::time::timeout(Duration::from_secs(5), brief.next_notification());
    assert!(waiting.await.expect("ends at the offer's expiry").is_none());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(matches!(
        refused(me.claim(brief.metadata()).await),
        GrantError::Expired { .. }
    ));
    assert!(matches!(
        refused(bg.read_blocks(&r, &local, &[0]).await),
        GrantError::Expired { .. } | GrantError::Revoked
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_takes_at_most_its_holders() {
    let owner = connector("cap-owner").await;
    let pool = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
    let offer = owner
        .offer(&pool, OfferOptions::read().max_holders(2))
        .unwrap();
    let meta = offer.metadata().clone();
    let (a, b, c) = (
        connector("cap-a").await,
        connector("cap-b").await,
        connector("cap-c").await,
    );
    let ga = a.claim_via(&meta, GrantLane::Tcp).await.unwrap();
    let _gb = b.claim_via(&meta, GrantLane::Tcp).await.unwrap();
    // A third worker: refused, typed, with nothing made for it.
    assert_eq!(
        refused(c.claim_via(&meta, GrantLane::Tcp).await),
        GrantError::TooManyHolders { max: 2 }
    );
    assert_eq!(offer.holders().len(), 2);
    // A holder claiming again replaces its grant: never refused for this.
    let ga2 = a.claim_via(&meta, GrantLane::Tcp).await.unwrap();
    assert_ne!(ga2.metadata().grant, ga.metadata().grant);
    // Once a holder is revoked, its place is free.
    offer.revoke_holder("cap-b").await.unwrap();
    let gc = c.claim_via(&meta, GrantLane::Tcp).await.unwrap();
    let local = Pool::allocate(BLOCK, BLOCK).unwrap();
    gc.read_blocks(&gc.block_refs(&[1]).unwrap(), &local, &[0])
        .await
        .unwrap();
    let mut holders = offer.holders();
    holders.sort();
    assert_eq!(holders, ["cap-a", "cap-c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offer_metadata_round_trips_and_a_write_offer_needs_a_writable_pool() {
    let owner = connector("owner").await;
    let pool = Pool::allocate(4 * BLOCK, BLOCK).unwrap();
    let o = owner.offer(&pool, OfferOptions::read_write()).unwrap();
    let back = OfferMetadata::from_json(&o.metadata().to_json().unwrap()).unwrap();
    assert_eq!(&back, o.metadata());
    assert_eq!((back.owner.as_str(), back.block_count), ("owner", 4));
    let mut mem = vec![0u8; 4 * BLOCK];
    let ptr = mem.as_mut_ptr();
    // SAFETY: the vector's buffer lives as long as the pool, which owns
    // it; nothing writes through the pool (it is read-only).
    let ro = unsafe { Pool::from_raw_parts(ptr, 4 * BLOCK, BLOCK, ferry::Device::CPU, false, mem) }
        .unwrap();
    assert!(matches!(
        owner.offer(&ro, OfferOptions::write()),
        Err(Error::Pool(ferry::PoolError::ReadOnly))
    ));
    assert!(owner.offer(&ro, OfferOptions::read()).is_ok());
}
