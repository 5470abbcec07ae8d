//! Standing grants over device memory, by CUDA IPC, between two processes:
//! blocks read and written by index between two GPU pools (bytes checked
//! through the driver on both sides), a notification, a revoke (the next
//! use refused and the owner's allocation unmapped here), a retired
//! generation refused with nothing landing, forged metadata refused, and
//! the pairs the lane does not copy refused with a reason.
//!
//! The owner is a second process (this test binary run again with `ROLE`
//! set) that grants a pool of its GPU memory, prints the grant, and then
//! obeys commands on its standard input (`REVOKE`, `RETIRE i`, `CHECK i
//! seed`, `NOTE`); this process is the holder.
//!
//! **Needs a GPU, or the fake CUDA driver**:
//! `FERRY_CUDA_LIB=$PWD/target/debug/libferry_fake_cuda.so cargo test -p
//! ferry --test grant_ipc` (`.ci/test` runs it so, after
//! `cargo build -p ferry-fake-cuda`). Without either every test says why
//! and passes at once; `FERRY_REQUIRE_CUDA=1` makes that a failure.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use ferry::cuda::CudaBuffer;
use ferry::{
    BlockRange, BlockRef, Connector, Device, Error, GrantError, GrantMetadata, GrantOptions, Pool,
    RemoteGrant,
};

// Its metadata and check helpers are the per-operation tests'.
#[allow(dead_code)]
#[path = "support/spawned.rs"]
mod spawned;
use spawned::{pattern, runtime, Server};

/// The environment variable that makes this binary an owner process.
const ROLE: &str = "FERRY_GRANT_IPC_TEST_OWN";
/// The owner's blocks, and their size.
const BLOCKS: usize = 16;
const BS: usize = 4096;
/// Where the granted pool starts in the owner's allocation.
const OFFSET: usize = 3 * BS;
/// The seed of the owner's bytes (block `i` holds `pattern(SEED, i, BS)`).
const SEED: u64 = 77;
const HOLDER: &str = "holder-0";
/// The blocks of the pool of [`one_gib_read_against_dtod`].
const BENCH_BLOCKS: usize = 16;
/// Its size where `FERRY_GRANT_IPC_BENCH_BYTES` does not say (1 GiB).
const BENCH_BYTES: usize = 1 << 30;
/// What a grant's READ must reach of `cuMemcpyDtoD` (issue 35).
const BENCH_FLOOR: f64 = 0.9;

/// Whether this test runs here; says why not.
fn gpu_here() -> bool {
    if ferry::cuda::available() {
        return true;
    }
    let why = ferry::cuda::status().unwrap_err();
    if std::env::var_os("FERRY_REQUIRE_CUDA").is_some_and(|v| v == "1") {
        panic!("FERRY_REQUIRE_CUDA=1, but CUDA is unavailable: {why}");
    }
    println!("skipped: needs a GPU or the fake CUDA driver (FERRY_CUDA_LIB; CUDA: {why})");
    false
}

async fn connector(id: &str) -> Connector {
    Connector::builder()
        .worker_id(id)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .expect("connector starts")
}

/// A pool of `blocks` blocks of GPU memory at `offset` in one allocation,
/// block `i` holding `fill(i)`; and the allocation, to read it back.
fn gpu_pool(
    blocks: usize,
    offset: usize,
    fill: impl Fn(usize) -> Vec<u8>,
) -> (Pool, Arc<CudaBuffer>) {
    gpu_pool_of(blocks, BS, offset, fill)
}

/// [`gpu_pool`] of blocks of `bs` bytes.
fn gpu_pool_of(
    blocks: usize,
    bs: usize,
    offset: usize,
    fill: impl Fn(usize) -> Vec<u8>,
) -> (Pool, Arc<CudaBuffer>) {
    let mut image = vec![0xEEu8; offset];
    for i in 0..blocks {
        image.extend_from_slice(&fill(i));
    }
    let mut buf = CudaBuffer::new(0, image.len()).expect("GPU memory");
    buf.copy_from_host(&image).unwrap();
    let buf = Arc::new(buf);
    let ptr = buf.device_ptr() + offset as u64;
    // SAFETY: `blocks * bs` bytes at `offset` of the allocation, which the
    // pool keeps alive (its owner); device memory, touched only through
    // the pool's descriptors (and read back by the test when idle).
    let pool = unsafe {
        Pool::from_raw_parts(
            ptr as *mut u8,
            blocks * bs,
            bs,
            Device::cuda(0),
            true,
            buf.clone(),
        )
    }
    .unwrap();
    (pool, buf)
}

/// Block `i` of a pool made by [`gpu_pool`], read through the driver.
fn block(buf: &CudaBuffer, offset: usize, i: usize) -> Vec<u8> {
    let mut all = vec![0u8; buf.len()];
    buf.copy_to_host(&mut all).unwrap();
    all[offset + i * BS..offset + (i + 1) * BS].to_vec()
}

// ---------------------------------------------------------------------------
// The owner process.

/// Grants a GPU pool (`read_write`, bound to [`HOLDER`]; with the spec
/// `expire <ms>`, for that long) and obeys its standard input until it
/// closes. With the spec `bench <bytes>`, the
/// pool is `bytes` of [`BENCH_BLOCKS`] blocks, block `i` all `i + 1`.
fn own(spec: &str) {
    let rt = runtime();
    rt.block_on(async {
        let c = connector("owner-0").await;
        let (pool, buf) = match spec.strip_prefix("bench ") {
            Some(bytes) => {
                let bs = bytes.parse::<usize>().unwrap() / BENCH_BLOCKS;
                gpu_pool_of(BENCH_BLOCKS, bs, 0, |i| vec![i as u8 + 1; bs])
            }
            None => gpu_pool(BLOCKS, OFFSET, |i| pattern(SEED, i, BS)),
        };
        let mut opts = GrantOptions::read_write().holder(HOLDER);
        if let Some(ms) = spec.strip_prefix("expire ") {
            opts = opts.expires_after(Duration::from_millis(ms.parse().unwrap()));
        }
        let grant = c.grant(&pool, opts).await.expect("a grant of GPU memory");
        let out = std::io::stdout();
        let say = |s: String| {
            let mut o = out.lock();
            writeln!(o, "{s}").unwrap();
            o.flush().unwrap();
        };
        say(format!("META {}", grant.metadata().to_json().unwrap()));
        let mut line = String::new();
        loop {
            line.clear();
            if std::io::stdin().read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["REVOKE"] => {
                    grant.revoke().await.unwrap();
                    say("REVOKED".into());
                }
                ["RETIRE", i] => {
                    let r = grant.retire(&[i.parse().unwrap()]).await.unwrap();
                    say(format!("RETIRED {}", r[0].generation));
                }
                ["CHECK", i, seed, as_of @ ..] => {
                    // Block `i` holds `pattern(seed, j, BS)`, `j` the last
                    // word where given, else `i`.
                    let (i, seed): (usize, u64) = (i.parse().unwrap(), seed.parse().unwrap());
                    let j = as_of.first().map_or(i, |j| j.parse().unwrap());
                    let ok = block(&buf, OFFSET, i) == pattern(seed, j, BS);
                    say(format!("CHECK {}", if ok { "ok" } else { "differs" }));
                }
                ["NOTE"] => {
                    let n =
                        tokio::time::timeout(Duration::from_secs(10), grant.next_notification())
                            .await
                            .ok()
                            .flatten();
                    match n {
                        Some(n) => say(format!(
                            "NOTE {} {} {}",
                            n.first_block,
                            n.block_count,
                            String::from_utf8_lossy(&n.payload)
                        )),
                        None => say("NOTE none".into()),
                    }
                }
                _ => say(format!("UNKNOWN {line}")),
            }
        }
        drop(grant);
        drop(pool);
    });
}

fn owned() -> bool {
    spawned::served(ROLE, own)
}

/// An owner process for test `name`, and its grant.
fn owner(name: &str) -> (Server, GrantMetadata) {
    let mut s = Server::start(name, ROLE, "gpu");
    let meta = GrantMetadata::from_json(&s.after("META ")).expect("the owner's grant");
    (s, meta)
}

/// Sends `cmd` to the owner; the rest of its answer tagged `tag`.
fn ask(s: &mut Server, cmd: &str, tag: &str) -> String {
    let stdin = s.child.stdin.as_mut().unwrap();
    writeln!(stdin, "{cmd}").unwrap();
    stdin.flush().unwrap();
    s.after(tag)
}

/// How many mappings of the fake driver's device memory this process has
/// (each opened IPC handle adds some; with a real driver, none show).
fn fake_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("ferry-fake-cuda"))
        .count()
}

fn using_fake() -> bool {
    ferry::cuda::status().is_ok_and(|s| s.contains("Ferry fake CUDA"))
}

fn grant_err<T: std::fmt::Debug>(r: ferry::Result<T>) -> GrantError {
    match r {
        Err(Error::Grant(g)) => g,
        other => panic!("expected a grant error, got {other:?}"),
    }
}

/// The local side: a GPU pool of 4 blocks (block `i` holding
/// `pattern(seed, i, BS)`), and the allocation.
fn local(seed: u64) -> (Pool, Arc<CudaBuffer>) {
    gpu_pool(4, 0, |i| pattern(seed, i, BS))
}

async fn open(c: &Connector, meta: &GrantMetadata) -> RemoteGrant {
    c.open_grant(meta).await.expect("the grant opens")
}

// ---------------------------------------------------------------------------

#[test]
fn blocks_move_by_index_between_two_gpu_pools() {
    if owned() || !gpu_here() {
        return;
    }
    let (mut s, meta) = owner("blocks_move_by_index_between_two_gpu_pools");
    assert!(meta.cuda_ipc.is_some() && meta.to_json().unwrap().len() <= 1024);
    let rt = runtime();
    rt.block_on(async {
        let c = connector(HOLDER).await;
        let (mine, buf) = local(5);
        let before = fake_mappings();
        let remote = open(&c, &meta).await;
        if using_fake() {
            assert!(fake_mappings() > before, "the handle is mapped at open");
        }
        // READ: owner blocks 3, 1, 7 into local blocks 0, 1, 2.
        let refs = remote.block_refs(&[3, 1, 7]).unwrap();
        remote.read_blocks(&refs, &mine, &[0, 1, 2]).await.unwrap();
        for (k, i) in [3, 1, 7].into_iter().enumerate() {
            assert!(block(&buf, 0, k) == pattern(SEED, i, BS), "local block {k}");
        }
        assert!(block(&buf, 0, 3) == pattern(5, 3, BS), "untouched");
        // Neighbours on both sides: one copy (owner 8, 9 into local 0, 1).
        let refs = remote.block_refs(&[8, 9]).unwrap();
        remote.read_blocks(&refs, &mine, &[0, 1]).await.unwrap();
        assert!(block(&buf, 0, 1) == pattern(SEED, 9, BS));

        // WRITE: local block 3 into owner block 12, notified.
        let target = remote.block_refs(&[12]).unwrap();
        remote
            .write_blocks(&mine, &[3], &target, Some(b"layer 0"))
            .await
            .unwrap();
        assert_eq!(ask(&mut s, "NOTE", "NOTE "), "12 1 layer 0");
        let mut got = String::new();
        for i in [11, 13] {
            got += &ask(&mut s, &format!("CHECK {i} {SEED}"), "CHECK ");
        }
        assert_eq!(got, "okok", "the neighbours are untouched");

        // Host memory on one side: refused, with which lane can.
        let host = Pool::allocate(4 * BS, BS).unwrap();
        let e = grant_err(remote.read_blocks(&refs, &host, &[0, 1]).await);
        assert!(
            matches!(&e, GrantError::NoLane(w) if w.contains("host memory")),
            "{e}"
        );
        // Out of range: typed, nothing copied.
        let e = grant_err(
            remote
                .read_blocks(&[BlockRef::new(BLOCKS as u32, 0)], &mine, &[0])
                .await,
        );
        assert!(matches!(e, GrantError::OutOfRange { .. }), "{e}");

        drop(remote);
        if using_fake() {
            assert_eq!(fake_mappings(), before, "closed when the grant drops");
        }
    });
    // Owner block 12 holds what local block 3 held: pattern(5, 3).
    assert_eq!(ask(&mut s, "CHECK 12 5 3", "CHECK "), "ok");
}

#[test]
fn byte_ranges_move_between_two_gpu_pools() {
    if owned() || !gpu_here() {
        return;
    }
    let (mut s, meta) = owner("byte_ranges_move_between_two_gpu_pools");
    let rt = runtime();
    rt.block_on(async {
        let c = connector(HOLDER).await;
        let (mine, buf) = local(5);
        let remote = open(&c, &meta).await;
        // READ: odd ranges of owner blocks 3 and 9 into local blocks 0, 2.
        let r = |i: u32, o: u64, n: u64| BlockRange::new(BlockRef::new(i, 0), o, n);
        let ranges = [r(3, 1, 100), r(9, BS as u64 - 7, 7)];
        remote
            .read_ranges(&ranges, &mine, &[(0, 5), (2, 0)], Some(b"read"))
            .await
            .unwrap();
        let mut want0 = pattern(5, 0, BS);
        want0[5..105].copy_from_slice(&pattern(SEED, 3, BS)[1..101]);
        let mut want2 = pattern(5, 2, BS);
        want2[..7].copy_from_slice(&pattern(SEED, 9, BS)[BS - 7..]);
        assert!(block(&buf, 0, 0) == want0, "local block 0");
        assert!(block(&buf, 0, 2) == want2, "local block 2");
        assert!(block(&buf, 0, 1) == pattern(5, 1, BS), "untouched");
        assert_eq!(ask(&mut s, "NOTE", "NOTE "), "3 2 read");
        // WRITE: 100 bytes of local block 3 into owner block 12 at 7.
        remote
            .write_ranges(&mine, &[(3, 10)], &[r(12, 7, 100)], Some(b"wrote"))
            .await
            .unwrap();
        assert_eq!(ask(&mut s, "NOTE", "NOTE "), "12 1 wrote");
        remote.notify(b"bare").await.unwrap();
        assert_eq!(ask(&mut s, "NOTE", "NOTE "), "0 0 bare");
        remote
            .read_blocks(&[BlockRef::new(12, 0)], &mine, &[1])
            .await
            .unwrap();
        let mut want = pattern(SEED, 12, BS);
        want[7..107].copy_from_slice(&pattern(5, 3, BS)[10..110]);
        assert!(block(&buf, 0, 1) == want, "owner block 12");
        // Past the block's end: typed, nothing copied.
        let e = grant_err(
            remote
                .write_ranges(&mine, &[(3, 0)], &[r(13, 1, BS as u64)], None)
                .await,
        );
        assert!(matches!(e, GrantError::LengthMismatch { .. }), "{e}");
    });
    assert_eq!(ask(&mut s, &format!("CHECK 13 {SEED}"), "CHECK "), "ok");
}

#[test]
fn a_revoke_refuses_the_next_use_and_closes_the_handle() {
    if owned() || !gpu_here() {
        return;
    }
    let (mut s, meta) = owner("a_revoke_refuses_the_next_use_and_closes_the_handle");
    let rt = runtime();
    rt.block_on(async {
        let c = connector(HOLDER).await;
        let (mine, _buf) = local(9);
        let before = fake_mappings();
        let remote = open(&c, &meta).await;
        let refs = remote.block_refs(&[2]).unwrap();
        remote.read_blocks(&refs, &mine, &[0]).await.unwrap();
        assert_eq!(ask(&mut s, "REVOKE", "REVOKED"), "");
        assert!(remote.is_revoked());
        let e = grant_err(remote.write_blocks(&mine, &[1], &refs, None).await);
        assert_eq!(e, GrantError::Revoked);
        if using_fake() {
            assert_eq!(fake_mappings(), before, "unmapped at the first use after");
        }
        let e = grant_err(remote.read_blocks(&refs, &mine, &[0]).await);
        assert_eq!(e, GrantError::Revoked);
        // Opened again: refused too.
        let again = c.open_grant(&meta).await;
        assert!(again.is_err(), "{again:?}");
    });
    assert_eq!(ask(&mut s, &format!("CHECK 2 {SEED}"), "CHECK "), "ok");
}

#[test]
fn an_expired_grant_is_refused_and_unmapped() {
    if owned() || !gpu_here() {
        return;
    }
    let name = "an_expired_grant_is_refused_and_unmapped";
    let mut s = Server::start(name, ROLE, "expire 400");
    let meta = GrantMetadata::from_json(&s.after("META ")).expect("the owner's grant");
    let rt = runtime();
    rt.block_on(async {
        let c = connector(HOLDER).await;
        let (mine, _buf) = local(2);
        let before = fake_mappings();
        let remote = open(&c, &meta).await;
        let refs = remote.block_refs(&[1]).unwrap();
        remote.read_blocks(&refs, &mine, &[0]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let e = grant_err(remote.write_blocks(&mine, &[1], &refs, None).await);
        assert!(matches!(e, GrantError::Expired { .. }), "{e}");
        if using_fake() {
            assert_eq!(fake_mappings(), before, "unmapped at the first use after");
        }
    });
    assert_eq!(ask(&mut s, &format!("CHECK 1 {SEED}"), "CHECK "), "ok");
}

#[test]
fn a_retired_generation_is_refused_and_nothing_lands() {
    if owned() || !gpu_here() {
        return;
    }
    let (mut s, meta) = owner("a_retired_generation_is_refused_and_nothing_lands");
    let rt = runtime();
    rt.block_on(async {
        let c = connector(HOLDER).await;
        let (mine, _buf) = local(3);
        let remote = open(&c, &meta).await;
        let old = remote.block_refs(&[4]).unwrap();
        assert_eq!(ask(&mut s, "RETIRE 4", "RETIRED "), "1");
        let e = grant_err(remote.write_blocks(&mine, &[0], &old, None).await);
        assert_eq!(
            e,
            GrantError::StaleGeneration {
                index: 4,
                named: 0,
                current: 1
            }
        );
        assert_eq!(ask(&mut s, &format!("CHECK 4 {SEED}"), "CHECK "), "ok");
        let e = grant_err(remote.read_blocks(&old, &mine, &[0]).await);
        assert!(matches!(e, GrantError::StaleGeneration { .. }), "{e}");
        // The fresh reference moves.
        let fresh = [BlockRef::new(4, 1)];
        remote
            .write_blocks(&mine, &[0], &fresh, None)
            .await
            .unwrap();
    });
    assert_eq!(ask(&mut s, "CHECK 4 3 0", "CHECK "), "ok");
}

#[test]
fn forged_grants_are_refused_typed() {
    if owned() || !gpu_here() {
        return;
    }
    let (_s, meta) = owner("forged_grants_are_refused_typed");
    let rt = runtime();
    rt.block_on(async {
        let c = connector(HOLDER).await;
        let before = fake_mappings();
        // Another handle, or the pool elsewhere in the allocation.
        let mut forged = meta.clone();
        if let Some(l) = forged.cuda_ipc.as_mut() {
            l.handle[20] ^= 0x40;
        }
        let e = grant_err(c.open_grant(&forged).await);
        assert!(matches!(e, GrantError::Forged { .. }), "{e}");
        let mut forged = meta.clone();
        if let Some(l) = forged.cuda_ipc.as_mut() {
            l.offset = 0;
        }
        let e = grant_err(c.open_grant(&forged).await);
        assert!(matches!(e, GrantError::Forged { .. }), "{e}");
        // No lane for device memory without its section.
        let mut stripped = meta.clone();
        stripped.cuda_ipc = None;
        let e = grant_err(c.open_grant(&stripped).await);
        assert!(matches!(e, GrantError::NoLane(_)), "{e}");
        // Another worker's.
        let other = connector("holder-1").await;
        let e = grant_err(other.open_grant(&meta).await);
        assert!(matches!(e, GrantError::NotYours { .. }), "{e}");
        assert_eq!(fake_mappings(), before, "nothing was mapped");
        // The real one still opens.
        let remote = open(&c, &meta).await;
        let (mine, _buf) = local(1);
        let refs = remote.block_refs(&[0]).unwrap();
        remote.read_blocks(&refs, &mine, &[0]).await.unwrap();
    });
}

#[test]
fn a_device_grant_within_one_process_is_refused_with_a_reason() {
    if owned() || !gpu_here() {
        return;
    }
    let rt = runtime();
    rt.block_on(async {
        let owner = connector("owner-0").await;
        let holder = connector(HOLDER).await;
        let (pool, _buf) = gpu_pool(2, 0, |i| pattern(1, i, BS));
        let grant = owner
            .grant(&pool, GrantOptions::read().holder(HOLDER))
            .await
            .unwrap();
        let e = grant_err(holder.open_grant(grant.metadata()).await);
        assert!(
            matches!(&e, GrantError::NoLane(w) if w.contains("this very process")),
            "{e}"
        );
    });
}

// ---------------------------------------------------------------------------
// The GPU check (scripts/gpu-check): a 1 GiB READ on a grant against
// cuMemcpyDtoD of the same bytes in this process, in the same run.

/// The median of `n` timings of `f`, after one untimed run.
fn median(n: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut t: Vec<Duration> = (0..n)
        .map(|_| {
            let t0 = std::time::Instant::now();
            f();
            t0.elapsed()
        })
        .collect();
    t.sort();
    t[n / 2]
}

/// A measurement for a GPU, run where `FERRY_GRANT_IPC_BENCH=1`
/// (scripts/gpu-check sets it); a skip otherwise.
#[test]
fn one_gib_read_against_dtod() {
    if owned() {
        return;
    }
    if std::env::var("FERRY_GRANT_IPC_BENCH").as_deref() != Ok("1") {
        println!("skipped: a measurement for a GPU; FERRY_GRANT_IPC_BENCH=1 runs it");
        return;
    }
    if !gpu_here() {
        return;
    }
    let bytes = std::env::var("FERRY_GRANT_IPC_BENCH_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BENCH_BYTES);
    let bs = bytes / BENCH_BLOCKS;
    let mut s = Server::start("one_gib_read_against_dtod", ROLE, &format!("bench {bytes}"));
    let meta = GrantMetadata::from_json(&s.after("META ")).expect("the owner's grant");
    let rt = runtime();
    let (mine, buf) = gpu_pool_of(BENCH_BLOCKS, bs, 0, |_| vec![0u8; bs]);
    let remote = rt.block_on(async { open(&connector(HOLDER).await, &meta).await });
    let all: Vec<u32> = (0..BENCH_BLOCKS as u32).collect();
    let refs = remote.block_refs(&all).unwrap();
    let grant = median(5, || {
        rt.block_on(remote.read_blocks(&refs, &mine, &all))
            .expect("the READ")
    });
    // Every block landed (its first and last byte).
    let mut back = vec![0u8; bytes];
    buf.copy_to_host(&mut back).unwrap();
    for i in 0..BENCH_BLOCKS {
        let b = &back[i * bs..(i + 1) * bs];
        assert!(b[0] == i as u8 + 1 && b[bs - 1] == i as u8 + 1, "block {i}");
    }
    drop(back);
    // The baseline: the same bytes device to device in this process.
    let src = CudaBuffer::new(0, bytes).expect("GPU memory");
    let mut dst = CudaBuffer::new(0, bytes).expect("GPU memory");
    let dtod = median(5, || dst.copy_from(&src).expect("cuMemcpyDtoD"));
    let gbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    let ratio = dtod.as_secs_f64() / grant.as_secs_f64();
    println!(
        "grant READ over CUDA IPC, {bytes} bytes ({BENCH_BLOCKS} blocks): {:.1} us, {:.1} GB/s; \
         cuMemcpyDtoD: {:.1} us, {:.1} GB/s; ratio {ratio:.3} (floor {BENCH_FLOOR})",
        grant.as_secs_f64() * 1e6,
        gbps(grant),
        dtod.as_secs_f64() * 1e6,
        gbps(dtod),
    );
    drop(remote);
    drop(s.child.stdin.take());
    if using_fake() {
        println!("the fake CUDA driver measures nothing: the ratio is not checked");
    } else {
        assert!(
            ratio >= BENCH_FLOOR,
            "a grant's READ at {ratio:.3} of cuMemcpyDtoD (needs {BENCH_FLOOR})"
        );
    }
}
