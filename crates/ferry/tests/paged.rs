//! Paged descriptors (blocks of a `Pool`) on every transport, between two
//! connectors of this process (the cross-process paged runs are in
//! crates/ferry-cli/tests/kv.rs and `ferry bench --workload kv`): random
//! block lists that differ on the two sides, byte for byte; slices of
//! blocks; blocks that follow each other (merged copies); mixed paged and
//! plain descriptors; and the refusals.

use ferry::{BlockView, Descriptor, Error, Pool, PoolError};

mod support;

use support::{pair, transports, TRANSPORTS};

/// A small deterministic generator (xorshift), so that failures repeat.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` distinct ids out of `0..max`, in random order.
    fn ids(&mut self, n: usize, max: u32) -> Vec<u32> {
        let mut all: Vec<u32> = (0..max).collect();
        for i in (1..all.len()).rev() {
            all.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
        all.truncate(n);
        all
    }
}

/// The byte at `i` of block `id` of a source pool.
fn byte(id: u32, i: usize) -> u8 {
    (id as usize * 7 + i * 13 + (i >> 8)) as u8
}

fn fill(pool: &Pool) {
    for id in 0..pool.block_count() as u32 {
        pool.with_block_mut(id, |b| {
            for (i, x) in b.iter_mut().enumerate() {
                *x = byte(id, i);
            }
        })
        .unwrap();
    }
}

/// Block `dst[k]` of `pool` holds bytes `view` of source block `src[k]`.
fn check(pool: &Pool, dst: &[u32], src: &[u32], offset: usize, len: usize) {
    for (k, (&d, &s)) in dst.iter().zip(src).enumerate() {
        pool.with_block(d, |b| {
            for (i, &x) in b[..len].iter().enumerate() {
                assert_eq!(
                    x,
                    byte(s, offset + i),
                    "entry {k}: block {d} from {s}, byte {i}"
                );
            }
        })
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_block_lists_move_byte_for_byte_on_every_transport() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for t in transports() {
        let (a, b) = pair(t).await;
        for (block, blocks, n) in [
            (4096usize, 600u32, 517usize),
            (1000, 64, 64),
            (3 << 20, 4, 3),
        ] {
            let src_pool = Pool::allocate(block * blocks as usize, block).unwrap();
            fill(&src_pool);
            let dst_pool = Pool::allocate(block * blocks as usize, block).unwrap();
            // READ: the reader pulls the readable's blocks into its own.
            let (src, dst) = (rng.ids(n, blocks), rng.ids(n, blocks));
            let r = a
                .create_readable(vec![src_pool.shared_blocks(&src).unwrap()])
                .await
                .unwrap();
            assert_eq!(r.metadata().descriptor_count(), n);
            assert_eq!(
                r.metadata().descriptors().len(),
                1,
                "one entry for {n} blocks"
            );
            let op = b
                .begin_read(r.metadata(), vec![dst_pool.blocks(&dst).unwrap()])
                .await
                .unwrap();
            op.wait_for_completion().await.unwrap();
            r.wait_for_completion().await.unwrap();
            assert_eq!(op.transport(), Some(t.kind), "{t}");
            drop((op, r));
            check(&dst_pool, &dst, &src, 0, block);

            // WRITE: the writer's blocks land in the writable's.
            let (src, dst) = (rng.ids(n, blocks), rng.ids(n, blocks));
            let out = Pool::allocate(block * blocks as usize, block).unwrap();
            let w = a
                .create_writable(vec![out.blocks(&dst).unwrap()])
                .await
                .unwrap();
            let op = b
                .begin_write(vec![src_pool.shared_blocks(&src).unwrap()], w.metadata())
                .await
                .unwrap();
            op.wait_for_completion().await.unwrap();
            w.wait_for_completion().await.unwrap();
            drop((op, w));
            check(&out, &dst, &src, 0, block);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_runs_and_mixed_descriptors_on_every_transport() {
    let block = 256usize;
    for t in transports() {
        let (a, b) = pair(t).await;
        let src_pool = Pool::allocate(block * 64, block).unwrap();
        fill(&src_pool);
        // Head slices: bytes 64..160 of each block, into whole blocks of
        // 96 bytes on the other side; runs of blocks that follow each other
        // on both sides (merged into one copy each); and a plain
        // descriptor between them.
        let view = BlockView {
            offset: 64,
            len: Some(96),
            shared: true,
        };
        let src: Vec<u32> = (10..30).chain(40..44).collect();
        let dst_pool = Pool::allocate(96 * 64, 96).unwrap();
        let dst: Vec<u32> = (0..20).chain([63, 50, 51, 52]).collect();
        let r = a
            .create_readable(vec![
                src_pool.blocks_with(&src, view).unwrap(),
                Descriptor::from_vec(vec![5; 1000]),
                src_pool.shared_blocks(&[0, 1, 2]).unwrap(),
            ])
            .await
            .unwrap();
        let whole = Pool::allocate(block * 8, block).unwrap();
        let op = b
            .begin_read(
                r.metadata(),
                vec![
                    dst_pool.blocks(&dst).unwrap(),
                    Descriptor::from_vec(vec![0; 1000]),
                    whole.blocks(&[5, 6, 7]).unwrap(),
                ],
            )
            .await
            .unwrap();
        op.wait_for_completion().await.unwrap();
        r.wait_for_completion().await.unwrap();
        let got = op.into_descriptors();
        assert!(
            got[0].as_slice().is_none(),
            "a paged descriptor is not one slice"
        );
        assert!(got[1].as_slice().unwrap().iter().all(|&x| x == 5));
        drop(got);
        check(&dst_pool, &dst, &src, 64, 96);
        check(&whole, &[5, 6, 7], &[0, 1, 2], 0, block);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_shapes_go_through() {
    // 16,384 blocks of 4 KiB (a KV cache at TP 8) on one host, by
    // cross-memory attach and over TCP.
    for t in [TRANSPORTS[1], TRANSPORTS[2]] {
        let (a, b) = pair(t).await;
        let n = 16_384u32;
        let src_pool = Pool::allocate(4096 * n as usize, 4096).unwrap();
        fill(&src_pool);
        let dst_pool = Pool::allocate(4096 * n as usize, 4096).unwrap();
        let mut rng = Rng(7);
        let (src, dst) = (rng.ids(n as usize, n), rng.ids(n as usize, n));
        let r = a
            .create_readable(vec![src_pool.shared_blocks(&src).unwrap()])
            .await
            .unwrap();
        assert!(
            r.metadata().to_json().len() < 1024,
            "metadata of 16,384 blocks"
        );
        let op = b
            .begin_read(r.metadata(), vec![dst_pool.blocks(&dst).unwrap()])
            .await
            .unwrap();
        op.wait_for_completion().await.unwrap();
        drop(op);
        check(&dst_pool, &dst, &src, 0, 4096);
    }
}

#[tokio::test]
async fn mismatches_and_busy_blocks_are_refused() {
    let (a, b) = pair(TRANSPORTS[0]).await;
    let pool = Pool::allocate(64 * 1024, 1024).unwrap();
    let r = a
        .create_readable(vec![pool.shared_blocks(&[1, 2, 3]).unwrap()])
        .await
        .unwrap();
    let other = Pool::allocate(64 * 2048, 2048).unwrap();
    // Three blocks of 2 KiB against three of 1 KiB.
    let e = b
        .begin_read(r.metadata(), vec![other.blocks(&[0, 1, 2]).unwrap()])
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::SizeMismatch {
                index: 0,
                local: 2048,
                remote: 1024
            }
        ),
        "{e}"
    );
    // Two blocks and a plain 1 KiB descriptor match three blocks.
    let mine = Pool::allocate(8 * 1024, 1024).unwrap();
    let e = b
        .begin_read(r.metadata(), vec![mine.blocks(&[4]).unwrap()])
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::CountMismatch {
                local: 1,
                remote: 3
            }
        ),
        "{e}"
    );
    let op = b
        .begin_read(
            r.metadata(),
            vec![
                mine.blocks(&[4, 5]).unwrap(),
                Descriptor::from_vec(vec![0; 1024]),
            ],
        )
        .await
        .unwrap();
    // While the operation holds blocks 4 and 5, nobody else gets them.
    assert_eq!(mine.blocks(&[5]).unwrap_err(), PoolError::Busy { id: 5 });
    op.wait_for_completion().await.unwrap();
    assert_eq!(
        mine.blocks(&[5]).unwrap_err(),
        PoolError::Busy { id: 5 },
        "until the descriptors go"
    );
    drop(op);
    assert!(mine.blocks(&[5]).is_ok());
    // A read into shared (read-only) blocks is misuse.
    let r2 = a
        .create_readable(vec![pool.shared_blocks(&[9]).unwrap()])
        .await
        .unwrap();
    let e = b
        .begin_read(r2.metadata(), vec![mine.shared_blocks(&[0]).unwrap()])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnlyDescriptor { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_that_span_many_blocks_land_byte_for_byte_over_tcp() {
    // Blocks of an odd size, more of them per 2 MiB frame than one
    // system call takes (1023 slices), in random order on both sides; a
    // slice of each block; plain, striped (parts cut inside blocks) and
    // encrypted connections.
    let (block, blocks, n) = (1000usize, 6000u32, 5003usize);
    let mut rng = Rng(0xfeed);
    let secret = "a shared secret of enough bytes for the test";
    let vias = [
        (TRANSPORTS[2], None),
        (TRANSPORTS[3], None),
        (TRANSPORTS[2], Some(secret)),
    ];
    for (t, secret) in vias {
        let build = || match secret {
            Some(s) => t.builder().secret(s).build(),
            None => t.builder().build(),
        };
        let (a, b) = (build().await.unwrap(), build().await.unwrap());
        let src_pool = Pool::allocate(block * blocks as usize, block).unwrap();
        fill(&src_pool);
        for (offset, len) in [(0, block), (3, 777)] {
            let view = |shared| BlockView {
                offset,
                len: Some(len),
                shared,
            };
            // READ.
            let dst_pool = Pool::allocate(block * blocks as usize, block).unwrap();
            let (src, dst) = (rng.ids(n, blocks), rng.ids(n, blocks));
            let r = a
                .create_readable(vec![src_pool.blocks_with(&src, view(true)).unwrap()])
                .await
                .unwrap();
            let op = b
                .begin_read(
                    r.metadata(),
                    vec![dst_pool.blocks_with(&dst, view(false)).unwrap()],
                )
                .await
                .unwrap();
            op.wait_for_completion().await.unwrap();
            r.wait_for_completion().await.unwrap();
            assert_eq!(op.transport(), Some(t.kind));
            drop((op, r));
            check_view(&dst_pool, &dst, &src, offset, len);

            // WRITE, with a plain descriptor after the blocks.
            let out = Pool::allocate(block * blocks as usize, block).unwrap();
            let (src, dst) = (rng.ids(n, blocks), rng.ids(n, blocks));
            let tail: Vec<u8> = (0..4099u32).map(|i| (i * 5) as u8).collect();
            let w = a
                .create_writable(vec![
                    out.blocks_with(&dst, view(false)).unwrap(),
                    Descriptor::from_vec(vec![0; tail.len()]),
                ])
                .await
                .unwrap();
            let op = b
                .begin_write(
                    vec![
                        src_pool.blocks_with(&src, view(true)).unwrap(),
                        Descriptor::from_vec(tail.clone()),
                    ],
                    w.metadata(),
                )
                .await
                .unwrap();
            op.wait_for_completion().await.unwrap();
            w.wait_for_completion().await.unwrap();
            drop(op);
            let got = w.into_descriptors();
            assert_eq!(got[1].as_slice().unwrap(), &tail[..], "{t}");
            drop(got);
            check_view(&out, &dst, &src, offset, len);
        }
    }
}

/// Bytes `offset..offset + len` of block `dst[k]` of `pool` hold those of
/// source block `src[k]`.
fn check_view(pool: &Pool, dst: &[u32], src: &[u32], offset: usize, len: usize) {
    for (k, (&d, &s)) in dst.iter().zip(src).enumerate() {
        pool.with_block(d, |b| {
            for (i, &x) in b[offset..offset + len].iter().enumerate() {
                assert_eq!(
                    x,
                    byte(s, offset + i),
                    "entry {k}: block {d} from {s}, byte {i}"
                );
            }
        })
        .unwrap();
    }
}
