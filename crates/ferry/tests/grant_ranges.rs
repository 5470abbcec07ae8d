//! Byte ranges inside the blocks of a grant, and notifications without
//! bytes, on every lane this host has (cross-memory attach, TCP, and UCX
//! over its TCP transport where `libucp` loads; skipped saying why
//! otherwise, a failure with `FERRY_REQUIRE_UCX=1`): ranges at odd offsets
//! and lengths read and written, every byte of both pools checked against
//! a model (so the bytes around each range are untouched); ranges past
//! their block, empty, in a block out of range, at a retired generation,
//! or without the right, refused typed with no byte moved; `notify` and a
//! READ's notification seen by the owner in order, with their kinds.
//!
//! The owner and the holder are two connectors of this one process.

use std::time::Duration;

use ferry::{
    BlockRange, BlockRef, Connector, Error, Grant, GrantError, GrantLane, GrantOptions,
    NotificationKind, Pool, RemoteGrant,
};

const SECRET: &str = "grant-ranges-test-secret";

async fn connector(worker: &str) -> Connector {
    Connector::builder()
        .worker_id(worker)
        .secret(SECRET)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .unwrap()
}

/// UCX over TCP only; `false` (and a line saying why) where UCX does not
/// load, unless `FERRY_REQUIRE_UCX=1`.
fn ucx_here() -> bool {
    if std::env::var_os("UCX_TLS").is_none() {
        std::env::set_var("UCX_TLS", "tcp");
    }
    match ferry::ucx::status() {
        Ok(_) => true,
        Err(why) => {
            if std::env::var_os("FERRY_REQUIRE_UCX").is_some_and(|v| v == "1") {
                panic!("FERRY_REQUIRE_UCX=1, but UCX does not load: {why}");
            }
            eprintln!("skipped: no UCX here ({why})");
            false
        }
    }
}

/// A pool's bytes, whole.
fn bytes(pool: &Pool) -> Vec<u8> {
    (0..pool.block_count() as u32)
        .flat_map(|i| pool.with_block(i, |b| b.to_vec()).unwrap())
        .collect()
}

/// Fills a pool with a pattern of `seed`, distinct per byte.
fn fill(pool: &Pool, seed: u8) {
    for i in 0..pool.block_count() as u32 {
        pool.with_block_mut(i, |b| {
            for (k, x) in b.iter_mut().enumerate() {
                *x = (k as u32)
                    .wrapping_mul(7)
                    .wrapping_add(i.wrapping_mul(131))
                    .wrapping_add(u32::from(seed)) as u8;
            }
        })
        .unwrap();
    }
}

/// One range's copy: from `(block, offset)`, to `(block, offset)`, bytes.
type Move = ((u32, u64), (u32, u64), u64);

/// What a range transfer does to `dst` (a model of a pool's bytes): copies
/// each range of `src` pairwise.
fn apply(dst: &mut [u8], dst_bs: usize, src: &[u8], src_bs: usize, moves: &[Move]) {
    for &((sb, so), (db, dofs), n) in moves {
        let s = sb as usize * src_bs + so as usize;
        let d = db as usize * dst_bs + dofs as usize;
        dst[d..d + n as usize].copy_from_slice(&src[s..s + n as usize]);
    }
}

fn at(ranges: &[(u32, u64, u64)]) -> Vec<BlockRange> {
    ranges
        .iter()
        .map(|&(b, o, n)| BlockRange::new(BlockRef::new(b, 0), o, n))
        .collect()
}

async fn opened(owner: &Connector, holder: &Connector, g: &Grant, lane: GrantLane) -> RemoteGrant {
    let r = holder.open_grant_via(g.metadata(), lane).await.unwrap();
    assert_eq!(r.lane(), lane);
    let _ = owner;
    r
}

async fn next(g: &Grant) -> ferry::Notification {
    tokio::time::timeout(Duration::from_secs(10), g.next_notification())
        .await
        .expect("a notification within 10 s")
        .expect("the grant lives")
}

fn refused<T: std::fmt::Debug>(r: ferry::Result<T>) -> GrantError {
    match r {
        Err(Error::Grant(e)) => e,
        other => panic!("expected a grant refusal, got {other:?}"),
    }
}

/// Reads and writes ranges at odd offsets and lengths over `lane`, with a
/// notification on each and a bare one, blocks of `bs` bytes.
async fn ranges_move_every_byte(lane: GrantLane, opts: GrantOptions, bs: usize) {
    let owner = connector("owner").await;
    let holder = connector("holder").await;
    let pool = Pool::allocate(8 * bs, bs).unwrap();
    fill(&pool, 1);
    let g = owner.grant(&pool, opts.holder("holder")).await.unwrap();
    let r = opened(&owner, &holder, &g, lane).await;
    let mine = Pool::allocate(6 * bs, bs).unwrap();
    for i in 0..6 {
        mine.with_block_mut(i, |b| b.fill(0xee)).unwrap();
    }
    let b = bs as u64;
    // READ: odd ranges (one a whole block, one ending at a block's end,
    // two that follow on), into disjoint places of local blocks.
    let remote = [
        (2, 1, 1),
        (2, 3, 100),
        (2, 103, 57),
        (5, b - 1, 1),
        (0, 17, b - 400),
        (7, 0, b),
        (1, b / 2 - 1, 3),
    ];
    let local = [
        (0, 0),
        (0, 5),
        (4, 1),
        (3, b - 1),
        (1, 33),
        (2, 0),
        (0, b - 3),
    ];
    let mut want = bytes(&mine);
    let theirs = bytes(&pool);
    let moves: Vec<Move> = remote
        .iter()
        .zip(&local)
        .map(|(&(rb, ro, n), &l)| ((rb, ro), l, n))
        .collect();
    apply(&mut want, bs, &theirs, bs, &moves);
    r.read_ranges(&at(&remote), &mine, &local, Some(b"read 1"))
        .await
        .unwrap();
    assert!(bytes(&mine) == want, "{lane:?}: the read's bytes");
    assert!(bytes(&pool) == theirs, "{lane:?}: a read wrote nothing");
    // WRITE: other odd ranges (local places may overlap), with a
    // notification.
    fill(&mine, 9);
    let remote = [
        (3, 0, 1),
        (3, 2, 5),
        (6, 11, b - 11),
        (4, 1, b - 2),
        (6, 0, 7),
    ];
    let local = [(5, 0), (5, 0), (1, 3), (0, 1), (2, b - 7)];
    let mut want = bytes(&pool);
    let mine_bytes = bytes(&mine);
    let moves: Vec<Move> = local
        .iter()
        .zip(&remote)
        .map(|(&l, &(rb, ro, n))| (l, (rb, ro), n))
        .collect();
    apply(&mut want, bs, &mine_bytes, bs, &moves);
    r.write_ranges(&mine, &local, &at(&remote), Some(b"write 2"))
        .await
        .unwrap();
    assert!(bytes(&pool) == want, "{lane:?}: the write's bytes");
    assert!(bytes(&mine) == mine_bytes, "{lane:?}: a write read only");
    r.notify(b"bare 3").await.unwrap();
    r.notify(b"").await.unwrap();
    // A range transfer without a notification queues none.
    r.read_ranges(&at(&[(0, 0, 1)]), &mine, &[(0, 0)], None)
        .await
        .unwrap();
    let seen: Vec<_> = [
        next(&g).await,
        next(&g).await,
        next(&g).await,
        next(&g).await,
    ]
    .into_iter()
    // Over TCP the owner sees the last request of an operation: its
    // first block is that request's.
    .map(|n| {
        (
            n.seq,
            n.kind,
            n.first_block * u32::from(lane != GrantLane::Tcp),
            n.payload,
        )
    })
    .collect();
    let first = |b: u32| b * u32::from(lane != GrantLane::Tcp);
    assert_eq!(
        seen,
        vec![
            (1, NotificationKind::Read, first(2), b"read 1".to_vec()),
            (2, NotificationKind::Write, first(3), b"write 2".to_vec()),
            (3, NotificationKind::Message, 0, b"bare 3".to_vec()),
            (4, NotificationKind::Message, 0, Vec::new()),
        ],
        "{lane:?}"
    );
    assert!(g.try_next_notification().is_none(), "{lane:?}");
}

/// Ranges refused, typed, with no byte moved on either side; then a
/// revoked grant refuses a bare notification.
async fn bad_ranges_are_refused(lane: GrantLane, opts: GrantOptions) {
    let bs = 4096usize;
    let b = bs as u64;
    let owner = connector("owner").await;
    let holder = connector("holder").await;
    let pool = Pool::allocate(4 * bs, bs).unwrap();
    fill(&pool, 3);
    let g = owner
        .grant(&pool, opts.clone().holder("holder"))
        .await
        .unwrap();
    let r = opened(&owner, &holder, &g, lane).await;
    let mine = Pool::allocate(2 * bs, bs).unwrap();
    fill(&mine, 4);
    let (theirs, ours) = (bytes(&pool), bytes(&mine));
    let unchanged = |what: &str| {
        assert!(bytes(&pool) == theirs, "{lane:?} {what}: the owner's bytes");
        assert!(bytes(&mine) == ours, "{lane:?} {what}: the holder's bytes");
    };
    let bytes_refused =
        |e: GrantError| matches!(e, GrantError::LengthMismatch { what: "bytes", .. });
    // Past the block's end; empty; in a block past the grant.
    for (what, remote) in [
        ("past the end", at(&[(1, 0, 10), (2, b - 3, 4)])),
        ("empty", at(&[(1, 5, 0)])),
        ("past u64", at(&[(1, u64::MAX, 2)])),
    ] {
        let e = refused(
            r.write_ranges(&mine, &[(0, 0), (1, 0)][..remote.len()], &remote, None)
                .await,
        );
        assert!(bytes_refused(e.clone()), "{lane:?} {what}: {e:?}");
        let e = refused(
            r.read_ranges(&remote, &mine, &[(0, 0), (1, 0)][..remote.len()], None)
                .await,
        );
        assert!(bytes_refused(e.clone()), "{lane:?} {what}: {e:?}");
        unchanged(what);
    }
    let e = refused(
        r.read_ranges(&at(&[(4, 0, 1)]), &mine, &[(0, 0)], None)
            .await,
    );
    assert_eq!(e, GrantError::OutOfRange { index: 4, count: 4 }, "{lane:?}");
    // The local place past its block, a local block past the pool, local
    // places of a read that overlap, as many places as ranges.
    let two = at(&[(1, 0, 10), (2, 0, 10)]);
    let e = refused(
        r.read_ranges(&two, &mine, &[(0, 0), (1, b - 9)], None)
            .await,
    );
    assert!(bytes_refused(e.clone()), "{lane:?}: {e:?}");
    let e = refused(r.read_ranges(&two, &mine, &[(0, 0), (2, 0)], None).await);
    assert_eq!(e, GrantError::OutOfRange { index: 2, count: 2 }, "{lane:?}");
    let e = refused(r.read_ranges(&two, &mine, &[(0, 0), (0, 9)], None).await);
    assert!(bytes_refused(e.clone()), "{lane:?}: {e:?}");
    let e = refused(r.read_ranges(&two, &mine, &[(0, 0)], None).await);
    assert!(
        matches!(e, GrantError::LengthMismatch { .. }),
        "{lane:?}: {e:?}"
    );
    // A notification too large, on a transfer or alone.
    let big = vec![0u8; ferry::grant::MAX_NOTIFICATION + 1];
    let e = refused(r.notify(&big).await);
    assert!(
        matches!(e, GrantError::NotificationTooLarge { .. }),
        "{lane:?}"
    );
    let e = refused(
        r.write_ranges(&mine, &[(0, 0)], &at(&[(1, 0, 1)]), Some(&big))
            .await,
    );
    assert!(
        matches!(e, GrantError::NotificationTooLarge { .. }),
        "{lane:?}"
    );
    unchanged("bad places");
    // A retired generation: refused, nothing lands; the current one goes.
    let fresh = g.retire(&[2]).await.unwrap();
    let stale = at(&[(1, 0, 8), (2, 100, 8)]);
    let e = refused(
        r.write_ranges(&mine, &[(0, 0), (0, 8)], &stale, Some(b"x"))
            .await,
    );
    assert!(
        matches!(
            e,
            GrantError::StaleGeneration {
                index: 2,
                named: 0,
                ..
            }
        ),
        "{lane:?}: {e:?}"
    );
    let e = refused(
        r.read_ranges(&stale, &mine, &[(0, 0), (0, 8)], Some(b"x"))
            .await,
    );
    assert!(
        matches!(e, GrantError::StaleGeneration { .. }),
        "{lane:?}: {e:?}"
    );
    unchanged("stale");
    assert!(
        g.try_next_notification().is_none(),
        "{lane:?}: a refusal notifies nothing"
    );
    let ok = [BlockRange::new(fresh[0], 100, 8)];
    r.write_ranges(&mine, &[(0, 0)], &ok, None).await.unwrap();
    assert_eq!(
        pool.with_block(2, |b| b[100..108].to_vec()).unwrap(),
        ours[..8].to_vec()
    );
    // Rights: a READ grant refuses writes, a WRITE grant reads; either
    // sends a bare notification.
    for (opts, read) in [(GrantOptions::read(), false), (GrantOptions::write(), true)] {
        let lane_opts = match lane {
            GrantLane::Ucx => opts.ucx(true).cma(false),
            _ => opts,
        };
        let g2 = owner
            .grant(&pool, lane_opts.holder("holder"))
            .await
            .unwrap();
        let r2 = opened(&owner, &holder, &g2, lane).await;
        let before = (bytes(&pool), bytes(&mine));
        let e = if read {
            refused(
                r2.read_ranges(&at(&[(0, 1, 2)]), &mine, &[(0, 0)], Some(b"n"))
                    .await,
            )
        } else {
            refused(
                r2.write_ranges(&mine, &[(0, 0)], &at(&[(0, 1, 2)]), Some(b"n"))
                    .await,
            )
        };
        assert!(
            matches!(e, GrantError::RightsMissing { .. }),
            "{lane:?}: {e:?}"
        );
        assert!(before == (bytes(&pool), bytes(&mine)), "{lane:?}: rights");
        r2.notify(b"hello").await.unwrap();
        let n = next(&g2).await;
        assert_eq!(
            (n.kind, &n.payload[..]),
            (NotificationKind::Message, &b"hello"[..])
        );
    }
    // Revoked: a bare notification is refused too.
    g.revoke().await.unwrap();
    let e = refused(r.notify(b"late").await);
    // Over UCX a revoke shuts the grant's worker: the holder sees the
    // owner's side gone.
    assert!(
        matches!(e, GrantError::Revoked)
            || (lane == GrantLane::Ucx && matches!(e, GrantError::OwnerGone(_))),
        "{lane:?}: {e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cma_ranges_move_every_byte() {
    ranges_move_every_byte(GrantLane::Cma, GrantOptions::read_write(), 4096).await;
    // Blocks larger than a copy chunk and a TCP request.
    ranges_move_every_byte(GrantLane::Cma, GrantOptions::read_write(), 3 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_ranges_move_every_byte() {
    ranges_move_every_byte(GrantLane::Tcp, GrantOptions::read_write(), 4096).await;
    // Ranges longer than one request, and ranges that follow on batched.
    ranges_move_every_byte(GrantLane::Tcp, GrantOptions::read_write(), 3 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cma_bad_ranges_are_refused_typed() {
    bad_ranges_are_refused(GrantLane::Cma, GrantOptions::read_write()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_bad_ranges_are_refused_typed() {
    bad_ranges_are_refused(GrantLane::Tcp, GrantOptions::read_write()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_ranges_move_every_byte_and_bad_ones_are_refused() {
    if !ucx_here() {
        return;
    }
    let ucx = GrantOptions::read_write().ucx(true).cma(false);
    ranges_move_every_byte(GrantLane::Ucx, ucx.clone(), 4096).await;
    bad_ranges_are_refused(GrantLane::Ucx, ucx).await;
}
