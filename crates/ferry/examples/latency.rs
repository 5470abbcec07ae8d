//! End-to-end latency of small operations between two connectors in one
//! process (no side channel): `cargo run --release --example latency`.
use std::time::Instant;

use ferry::{Connector, Descriptor};

#[tokio::main]
async fn main() -> ferry::Result<()> {
    let a = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await?;
    let b = Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await?;
    for size in [4096usize, 65536] {
        let mut lat = Vec::new();
        for i in 0..2000 {
            let t = Instant::now();
            let w = a
                .create_writable(vec![Descriptor::from_vec(vec![0; size])])
                .await?;
            let op = b
                .begin_write(vec![vec![1u8; size].into()], w.metadata())
                .await?;
            op.wait_for_completion().await?;
            w.wait_for_completion().await?;
            if i >= 100 {
                lat.push(t.elapsed().as_micros() as u64);
            }
        }
        lat.sort_unstable();
        println!(
            "{size} B write, both sides complete: p50 {} us, p99 {} us",
            lat[lat.len() / 2],
            lat[lat.len() * 99 / 100]
        );
    }
    Ok(())
}
