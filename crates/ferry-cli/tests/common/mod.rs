//! A harness for tests that cross a process boundary: a connector in the test
//! process and one or more `ferry peer` processes driven over pipes.
#![allow(dead_code)]

pub mod netns;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ferry::{Connector, Descriptor, OperationStatus, RdmaMetadata, TransportKind};
use ferry_cli::peer::{self, Answers, Cmd, Event, PeerProcess, Request};

pub fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ferry"))
}

/// The transports to run the shared suite over, from `FERRY_TRANSPORTS`
/// (default: every transport of this build).
pub fn env() -> Vec<(&'static str, String)> {
    match std::env::var(ferry::TRANSPORTS_ENV) {
        Ok(v) => vec![(ferry::TRANSPORTS_ENV, v)],
        Err(_) => Vec::new(),
    }
}

pub async fn connector() -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .await
        .expect("connector starts")
}

pub async fn peer() -> PeerProcess {
    let env = env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    PeerProcess::spawn(exe(), &["--listen", "127.0.0.1:0"], &env)
        .await
        .expect("peer process starts")
}

/// A connector over exactly `transports`, every transfer by attach when
/// `cma` is among them.
pub async fn connector_over(transports: &[TransportKind]) -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(transports)
        .cma_threshold(0)
        .ucx_trusted_network(true)
        .ucx_emulated_rma(true)
        .build()
        .await
        .expect("connector starts")
}

/// `lanes`, and a UCX lane (`[Ucx, Tcp]`, one stream) when this process
/// can load UCX (else one line says why it is skipped).
pub fn with_ucx(mut lanes: Vec<(TransportKind, usize)>) -> Vec<(TransportKind, usize)> {
    match ferry::ucx::status() {
        Ok(_) => lanes.push((TransportKind::Ucx, 1)),
        Err(why) if std::env::var_os("FERRY_REQUIRE_UCX").is_some() => {
            panic!("FERRY_REQUIRE_UCX is set but UCX cannot start: {why}")
        }
        Err(why) => eprintln!("skipped: the ucx lane (no UCX here: {why})"),
    }
    lanes
}

/// The transports a connector of a lane enables: the lane's own, and TCP.
pub fn lane_transports(t: TransportKind) -> Vec<TransportKind> {
    match t {
        TransportKind::Tcp => vec![TransportKind::Tcp],
        other => vec![other, TransportKind::Tcp],
    }
}

/// A peer process over exactly `transports` (see [`connector_over`]), with
/// extra command-line arguments.
pub async fn peer_over(transports: &[TransportKind], args: &[&str]) -> PeerProcess {
    peer_striped(transports, 1, args).await
}

/// A connector over TCP only whose transfers of 4 bytes or more are split
/// over `streams` connections.
pub async fn connector_striped(streams: usize) -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(streams)
        .stripe_threshold(4)
        .ucx_trusted_network(true)
        .ucx_emulated_rma(true)
        .build()
        .await
        .expect("connector starts")
}

/// A peer process as [`peer_over`], whose transfers over TCP of 4 bytes or
/// more are split over `streams` connections.
pub async fn peer_striped(
    transports: &[TransportKind],
    streams: usize,
    args: &[&str],
) -> PeerProcess {
    peer_with_env(transports, streams, args, &[]).await
}

/// A peer process as [`peer_striped`], with extra environment variables.
pub async fn peer_with_env(
    transports: &[TransportKind],
    streams: usize,
    args: &[&str],
    extra: &[(&str, &str)],
) -> PeerProcess {
    peer_on(&Host::loopback(), transports, streams, args, extra).await
}

/// Where a peer process runs, and the address it listens on.
pub struct Host<'a> {
    /// The command the peer is started through (none: directly).
    pub wrapper: Vec<&'a str>,
    /// The address it listens on (port 0).
    pub ip: IpAddr,
}

impl Host<'_> {
    /// This host, on loopback.
    pub fn loopback() -> Host<'static> {
        Host {
            wrapper: Vec::new(),
            ip: Ipv4Addr::LOCALHOST.into(),
        }
    }
}

impl netns::TwoHosts {
    /// The other host: peers run in the namespace and listen on its address.
    pub fn other(&self) -> Host<'_> {
        Host {
            wrapper: self.wrapper().to_vec(),
            ip: self.there,
        }
    }
}

/// A peer process as [`peer_with_env`], on `host`.
pub async fn peer_on(
    host: &Host<'_>,
    transports: &[TransportKind],
    streams: usize,
    args: &[&str],
    extra: &[(&str, &str)],
) -> PeerProcess {
    let names: Vec<&str> = transports.iter().map(|t| t.name()).collect();
    let names = names.join(",");
    let streams = streams.to_string();
    let listen = SocketAddr::new(host.ip, 0).to_string();
    let mut all = vec!["--listen", listen.as_str()];
    all.extend_from_slice(args);
    let mut env = vec![
        (ferry::TRANSPORTS_ENV, names.as_str()),
        (ferry::CMA_THRESHOLD_ENV, "0"),
        (ferry::TCP_STREAMS_ENV, streams.as_str()),
        (ferry::STRIPE_THRESHOLD_ENV, "4"),
        (ferry::UCX_TRUSTED_NETWORK_ENV, "1"),
        (ferry::UCX_EMULATED_RMA_ENV, "1"),
    ];
    env.extend_from_slice(extra);
    PeerProcess::spawn_in(&host.wrapper, exe(), &all, &env)
        .await
        .expect("peer process starts")
}

/// A connector listening on `ip`, set up as [`peer_on`] sets up its peer:
/// exactly `transports`, every transfer by attach when `cma` is among them,
/// TCP transfers of 4 bytes or more split over `streams` connections.
pub async fn connector_on(ip: IpAddr, transports: &[TransportKind], streams: usize) -> Connector {
    Connector::builder()
        .listen(SocketAddr::new(ip, 0))
        .transports(transports)
        .cma_threshold(0)
        .tcp_streams(streams)
        .stripe_threshold(4)
        .ucx_trusted_network(true)
        .ucx_emulated_rma(true)
        .build()
        .await
        .expect("connector starts")
}

/// The four directed pairings between `local` and the peer `p`, over `t`.
pub async fn pairings_between(
    local: &ferry::Connector,
    p: &PeerProcess,
    sizes: &[u64],
    t: TransportKind,
    streams: usize,
) {
    let name = Some(t.name());

    // 1. The peer exposes a readable; this process reads it.
    let (mut a, meta) = expose(p, Cmd::Readable, sizes, 11).await;
    let read = local.begin_read(&meta, zeroed(sizes)).await.unwrap();
    read.wait_for_completion().await.unwrap();
    assert_eq!(read.status(), OperationStatus::Complete);
    assert_eq!(read.transport(), Some(t));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "{ev:?}");
    assert_eq!(ev.transport.as_deref(), name, "{ev:?}");
    assert!(
        peer::verify(&read.into_descriptors(), 11),
        "bytes read differ"
    );

    // 2. This process exposes a readable; the peer reads it.
    let readable = local.create_readable(filled(sizes, 12)).await.unwrap();
    let mut a = p
        .request(with_meta(req(Cmd::Read, sizes, 12), readable.metadata()))
        .await
        .unwrap();
    readable.wait_for_completion().await.unwrap();
    assert_eq!(readable.transport(), Some(t));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "{ev:?}");
    assert_eq!(ev.transport.as_deref(), name, "{ev:?}");
    assert_eq!(ev.verified, Some(true), "the peer read other bytes: {ev:?}");

    // 3. The peer exposes a writable; this process writes it.
    let (mut a, meta) = expose(p, Cmd::Writable, sizes, 13).await;
    let write = local.begin_write(filled(sizes, 13), &meta).await.unwrap();
    write.wait_for_completion().await.unwrap();
    assert_eq!(write.transport(), Some(t));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "{ev:?}");
    assert_eq!(ev.transport.as_deref(), name, "{ev:?}");
    assert_eq!(
        ev.verified,
        Some(true),
        "the peer received other bytes: {ev:?}"
    );

    // 4. This process exposes a writable; the peer writes it.
    let writable = local.create_writable(zeroed(sizes)).await.unwrap();
    let mut a = p
        .request(with_meta(req(Cmd::Write, sizes, 14), writable.metadata()))
        .await
        .unwrap();
    writable.wait_for_completion().await.unwrap();
    assert_eq!(writable.transport(), Some(t));
    let ev = done(&mut a).await;
    assert_eq!(ev.status.as_deref(), Some("COMPLETE"), "{ev:?}");
    assert_eq!(ev.transport.as_deref(), name, "{ev:?}");
    assert!(
        peer::verify(&writable.into_descriptors(), 14),
        "bytes written differ"
    );

    // Nothing stays exposed or lent once every operation has ended.
    assert_eq!(local.exposed_count(), 0);
    assert_eq!(local.pending_count(), 0);
    if sizes.iter().sum::<u64>() >= 4 {
        // This side's own transfers went over one connection per stream.
        assert_eq!(local.connection_count(), streams);
    }
}

pub fn req(cmd: Cmd, sizes: &[u64], seed: u64) -> Request {
    let mut r = Request::new(0, cmd);
    r.sizes = sizes.to_vec();
    r.seed = seed;
    r
}

pub fn with_meta(mut r: Request, m: &RdmaMetadata) -> Request {
    r.metadata = Some(m.to_json());
    r
}

/// Asks the peer to expose memory; returns the answers and the metadata.
pub async fn expose(
    p: &PeerProcess,
    cmd: Cmd,
    sizes: &[u64],
    seed: u64,
) -> (Answers, RdmaMetadata) {
    let mut a = p.request(req(cmd, sizes, seed)).await.unwrap();
    let m = a.expect("metadata").await.unwrap();
    let meta = RdmaMetadata::from_json(m.metadata.as_deref().unwrap()).unwrap();
    (a, meta)
}

pub async fn done(a: &mut Answers) -> Event {
    tokio::time::timeout(Duration::from_secs(120), a.expect("done"))
        .await
        .expect("the peer answers within 120 s")
        .unwrap()
}

pub fn filled(sizes: &[u64], seed: u64) -> Vec<Descriptor<'static>> {
    peer::buffers(sizes, Some(seed))
}

pub fn zeroed(sizes: &[u64]) -> Vec<Descriptor<'static>> {
    peer::buffers(sizes, None)
}

/// 16 descriptors of mixed sizes, 1 byte to 1 MiB.
pub fn mixed16() -> Vec<u64> {
    vec![
        1,
        7,
        8,
        9,
        100,
        4095,
        4096,
        4097,
        65535,
        65536,
        65537,
        1 << 20,
        3,
        333_333,
        12,
        1000,
    ]
}
