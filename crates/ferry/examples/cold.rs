//! Time of the first operation between two fresh connectors of this process
//! (connection set-up included): `cargo run --release --example cold`.
use std::time::Instant;

use ferry::{Connector, Descriptor, TransportKind};

#[tokio::main]
async fn main() -> ferry::Result<()> {
    for t in [
        &[TransportKind::Tcp][..],
        &[TransportKind::Cma, TransportKind::Tcp][..],
    ] {
        for _ in 0..3 {
            let mk = || {
                Connector::builder()
                    .listen("127.0.0.1:0".parse().unwrap())
                    .transports(t)
                    .build()
            };
            let (a, b) = (mk().await?, mk().await?);
            let t0 = Instant::now();
            let w = a
                .create_writable(vec![Descriptor::from_vec(vec![0; 4096])])
                .await?;
            let op = b
                .begin_write(vec![vec![1u8; 4096].into()], w.metadata())
                .await?;
            let t1 = t0.elapsed();
            op.wait_for_completion().await?;
            w.wait_for_completion().await?;
            println!("{t:?}: connect+start {t1:?}, first op {:?}", t0.elapsed());
        }
    }
    Ok(())
}
