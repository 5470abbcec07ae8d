//! `ferry demo`: one process exposes a buffer, a second process (a peer
//! started by the demo) reads it and writes it back.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use ferry::Connector;

use crate::peer::{self, Cmd, PeerProcess, Request};

fn gbps(bytes: u64, micros: u64) -> f64 {
    bytes as f64 / (micros.max(1) as f64 * 1e3)
}

/// Runs the demo with a buffer of `size` bytes split in `descs` descriptors.
pub async fn run(exe: &Path, size: u64, descs: usize) -> anyhow::Result<()> {
    let descs = descs.max(1);
    let mut sizes = vec![size / descs as u64; descs];
    sizes[0] += size % descs as u64;
    let connector = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await?;
    let started = Instant::now();
    let peer = PeerProcess::spawn(exe, &["--listen", "127.0.0.1:0"], &[]).await?;
    println!(
        "demo: worker {} started peer process {} (pid {}) in {:.1} ms",
        connector.worker_id(),
        peer.worker_id,
        peer.pid().unwrap_or(0),
        started.elapsed().as_secs_f64() * 1e3
    );

    // 1. This process exposes a buffer; the peer reads it.
    let seed = 0x5eed;
    let t = Instant::now();
    let readable = connector
        .create_readable(peer::buffers(&sizes, Some(seed)))
        .await?;
    let json = readable.metadata().to_json();
    let mut req = Request::new(0, Cmd::Read);
    req.sizes = sizes.clone();
    req.seed = seed;
    req.metadata = Some(json.clone());
    let mut ans = peer.request(req).await?;
    readable.wait_for_completion().await?;
    let done = ans.expect("done").await?;
    let micros = t.elapsed().as_micros() as u64;
    if done.verified != Some(true) {
        bail!("the peer's read did not verify: {done:?}");
    }
    println!(
        "READ : peer read {} bytes in {} descriptor(s) from this process over {}: {:.2} ms, {:.2} GB/s end to end, every byte verified (metadata: {} bytes of JSON)",
        size,
        descs,
        readable.transport().map(|t| t.name()).unwrap_or("?"),
        micros as f64 / 1e3,
        gbps(size, micros),
        json.len()
    );

    // 2. This process exposes an empty buffer; the peer writes the data back.
    let t = Instant::now();
    let writable = connector
        .create_writable(peer::buffers(&sizes, None))
        .await?;
    let mut req = Request::new(0, Cmd::Write);
    req.sizes = sizes.clone();
    req.seed = seed;
    req.metadata = Some(writable.metadata().to_json());
    let mut ans = peer.request(req).await?;
    writable
        .wait_for_completion()
        .await
        .context("waiting for the peer's write")?;
    let done = ans.expect("done").await?;
    let micros = t.elapsed().as_micros() as u64;
    if done.error.is_some() {
        bail!("the peer's write failed: {done:?}");
    }
    let back = writable.into_descriptors();
    if !peer::verify(&back, seed) {
        bail!("the bytes written back differ from the pattern");
    }
    println!(
        "WRITE: peer wrote {} bytes back into this process: {:.2} ms, {:.2} GB/s end to end, every byte verified",
        size,
        micros as f64 / 1e3,
        gbps(size, micros)
    );

    // 3. Small-operation latency, end to end (create, hand over, transfer, both sides done).
    let mut lat = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let w = connector
            .create_writable(peer::buffers(&[4096], None))
            .await?;
        let mut req = Request::new(0, Cmd::Write);
        req.sizes = vec![4096];
        req.seed = 1;
        req.metadata = Some(w.metadata().to_json());
        let mut ans = peer.request(req).await?;
        w.wait_for_completion().await?;
        ans.expect("done").await?;
        lat.push(t.elapsed().as_micros() as u64);
    }
    lat.sort_unstable();
    println!(
        "4 KiB WRITE, end to end including the metadata hand-over through a pipe: p50 {} us, p99 {} us (200 operations)",
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
    Ok(())
}
