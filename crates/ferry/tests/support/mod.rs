//! Helpers shared by the test binaries of this directory, each of which
//! includes this module with `mod support;` and uses only some of it:
//!
//! - the one table of transports that the suites run over ([`transports`],
//!   [`Via`]), with the builder configuration of each row;
//! - transfer helpers: [`pattern`], [`descs`], [`check`];
//! - the bad-input tests' hostile peer: a panic watch, a hand-driven
//!   connection ([`Raw`]) and frame builders, the checks that a connector
//!   still serves legitimate holders, and a fake passive side
//!   ([`fake_passive`]);
//! - [`uffd`]: memory whose pages never arrive, for peers that stall a copy.
#![allow(dead_code)]

pub mod hand;
pub mod uffd;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

use ferry::{
    AbortReason, Connector, ConnectorBuilder, Descriptor, Error, OperationKind, OperationStatus,
    RdmaMetadata, TransportKind,
};
use ferry_proto::lane::LaneId;
use ferry_proto::wire::{self, Data, Hello, LaneOffer, Message, Open, PROTOCOL_VERSION};
use ferry_proto::Token;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

// ---------------------------------------------------------------------------
// The transports.

/// A transport, and for TCP the streams per transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Via {
    pub kind: TransportKind,
    pub streams: usize,
}

impl Via {
    /// A plain copy between two connectors of one process.
    pub const LOCAL: Via = Via {
        kind: TransportKind::Local,
        streams: 1,
    };
    /// Cross-memory attach (to this same process).
    pub const CMA: Via = Via {
        kind: TransportKind::Cma,
        streams: 1,
    };
    /// TCP, one stream.
    pub const TCP: Via = Via {
        kind: TransportKind::Tcp,
        streams: 1,
    };
    /// UCX (over shared memory here; `UCX_TLS` picks its transports).
    pub const UCX: Via = Via {
        kind: TransportKind::Ucx,
        streams: 1,
    };
    /// TCP striped over four streams.
    pub const TCP_X4: Via = Via {
        kind: TransportKind::Tcp,
        streams: 4,
    };

    /// A builder for a connector on loopback restricted to this transport
    /// (and TCP, which cannot be disabled): cross-memory attach from the
    /// first byte (`cma_threshold(0)`), and TCP transfers split over
    /// `streams` connections whatever their size (`stripe_threshold(1)`).
    /// Add to it what a test needs (a secret, say).
    pub fn builder(self) -> ConnectorBuilder {
        let only: Vec<TransportKind> = if self.kind == TransportKind::Tcp {
            vec![self.kind]
        } else {
            vec![self.kind, TransportKind::Tcp]
        };
        Connector::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .transports(&only)
            .cma_threshold(0)
            .ucx_trusted_network(true)
            .ucx_emulated_rma(true)
            .tcp_streams(self.streams)
            .stripe_threshold(1)
    }

    /// A connector built by [`Via::builder`].
    pub async fn connector(self) -> Connector {
        self.builder().build().await.unwrap()
    }
}

/// The transports of this build that need nothing at run time: a plain
/// copy, cross-memory attach, TCP, and TCP striped over four streams.
pub const TRANSPORTS: [Via; 4] = [Via::LOCAL, Via::CMA, Via::TCP, Via::TCP_X4];

/// The environment variable that makes a missing UCX fail the suites
/// instead of skipping their UCX rows (CI sets it).
pub const REQUIRE_UCX_ENV: &str = "FERRY_REQUIRE_UCX";

/// The transports the cancel tests run over: all of [`transports`]. (UCX
/// among them since a lease over UCX ends only once the destination's gets
/// have drained: its gets are emulated on this machine, answered by the
/// source's own process from the lent memory.)
pub fn cancel_transports() -> Vec<Via> {
    transports()
}

/// Every transport the suites run over: [`TRANSPORTS`], and UCX when this
/// process can load it (else one line says why its rows are skipped, or,
/// with `FERRY_REQUIRE_UCX=1`, the test fails).
pub fn transports() -> Vec<Via> {
    let mut v = TRANSPORTS.to_vec();
    match ferry::ucx::status() {
        Ok(_) => v.push(Via::UCX),
        Err(why) if std::env::var_os(REQUIRE_UCX_ENV).is_some() => {
            panic!("{REQUIRE_UCX_ENV} is set but UCX cannot start: {why}")
        }
        Err(why) => eprintln!("skipped: the ucx rows (no UCX here: {why})"),
    }
    v
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.streams {
            1 => write!(f, "{}", self.kind),
            n => write!(f, "{} x{n}", self.kind),
        }
    }
}

/// Two connectors over `t`.
pub async fn pair(t: Via) -> (Connector, Connector) {
    (t.connector().await, t.connector().await)
}

// ---------------------------------------------------------------------------
// Transfers.

/// `size` bytes that differ with `seed` and along the buffer.
pub fn pattern(seed: u8, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Owned descriptors of `sizes`: descriptor `i` holds
/// `pattern(seed + i, size)`, or zeros without a seed.
pub fn descs(sizes: &[usize], seed: Option<u8>) -> Vec<Descriptor<'static>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| match seed {
            Some(seed) => Descriptor::from_vec(pattern(seed.wrapping_add(i as u8), s)),
            None => Descriptor::from_vec(vec![0; s]),
        })
        .collect()
}

/// `got` holds what [`descs`] put in with `seed`.
pub fn check(got: &[Descriptor<'_>], sizes: &[usize], seed: u8) {
    for (i, (d, &s)) in got.iter().zip(sizes).enumerate() {
        assert!(
            d.as_slice().unwrap() == pattern(seed.wrapping_add(i as u8), s).as_slice(),
            "descriptor {i} differs"
        );
    }
}

// ---------------------------------------------------------------------------
// Panic watch: a panic inside the library (in any task) fails the test.

pub static LIBRARY_PANICS: AtomicUsize = AtomicUsize::new(0);

pub fn watch_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_library = info.location().is_some_and(|l| {
                let f = l.file().replace('\\', "/");
                f.contains("ferry/src/") || f.contains("ferry-proto/src/")
            });
            let in_worker = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("tokio-runtime-worker"));
            if in_library || in_worker {
                LIBRARY_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

pub fn assert_no_library_panic() {
    assert_eq!(
        LIBRARY_PANICS.load(Ordering::SeqCst),
        0,
        "code inside the library panicked (see the panic message above)"
    );
}

// ---------------------------------------------------------------------------
// The hostile peer: connectors under attack, frames, a raw connection.

/// How long any single step may take before the test fails.
pub const STEP: Duration = Duration::from_secs(2);

/// What untouched exposed memory holds.
pub const UNTOUCHED: u8 = 0xEE;

/// A connector on loopback. Its active operations use TCP only, so that the
/// legitimate transfers of these tests go through the listener under attack
/// even when a faster same-process transport exists, and one stream (the
/// fake passive sides below claim another host, where large transfers would
/// otherwise be striped).
pub async fn connector() -> Connector {
    watch_panics();
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(1)
        .build()
        .await
        .expect("connector starts")
}

/// A connector like [`connector`] whose transfers of a byte or more are
/// split over `streams` connections.
pub async fn striped_connector(streams: usize) -> Connector {
    watch_panics();
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(streams)
        .stripe_threshold(1)
        .build()
        .await
        .expect("connector starts")
}

/// A connector that may use cross-memory attach.
pub async fn attaching_connector() -> Connector {
    watch_panics();
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Cma, TransportKind::Tcp])
        .build()
        .await
        .expect("connector starts")
}

pub async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    timeout(STEP, f).await.expect("step took more than 2 s")
}

pub fn untouched(size: usize) -> Descriptor<'static> {
    vec![UNTOUCHED; size].into()
}

pub fn sizes_of(m: &RdmaMetadata) -> Vec<u64> {
    m.sizes()
}

pub fn open_frame(req: u64, m: &RdmaMetadata, kind: OperationKind) -> Message {
    Message::Open(Open {
        req,
        op_id: m.operation_id(),
        token: *m.token(),
        kind,
        sizes: sizes_of(m).into(),
        pull: false,
        part: 0,
        parts: 1,
    })
}

/// The `Open` of part `part` of `parts` of a striped transfer.
pub fn part_open(
    req: u64,
    m: &RdmaMetadata,
    kind: OperationKind,
    part: u16,
    parts: u16,
) -> Message {
    let Message::Open(o) = open_frame(req, m, kind) else {
        unreachable!()
    };
    Message::Open(Open { part, parts, ..o })
}

/// A `Data` frame followed by its payload.
pub fn data_frame(req: u64, desc: u32, offset: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Message::Data(Data {
        req,
        desc,
        offset,
        len: payload.len() as u32,
    })
    .to_vec();
    v.extend_from_slice(payload);
    v
}

pub fn header(ty: u8, body_len: u32) -> Vec<u8> {
    let mut v = vec![ty, 0, 0, 0];
    v.extend_from_slice(&body_len.to_le_bytes());
    v
}

/// Deterministic pseudo-random bytes.
pub fn noise(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

/// What one side found when it tried to read the other's cookie (in a
/// cross-memory attach offer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Unknown,
    CanPull,
    Refused,
}

/// A cross-memory attach offer: the bytes of a `LaneOffer` of lane 1, as
/// these tests write them (30 bytes: pid, cookie address, nonce or proof
/// bytes, verdict, CUDA IPC offer), independently of the library's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attach {
    pub pid: u32,
    pub addr: u64,
    pub cookie: [u8; 16],
    pub verdict: Verdict,
    pub cuda_ipc: bool,
}

impl Attach {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.addr.to_le_bytes());
        v.extend_from_slice(&self.cookie);
        v.push(match self.verdict {
            Verdict::Unknown => 0,
            Verdict::CanPull => 1,
            Verdict::Refused => 2,
        });
        v.push(u8::from(self.cuda_ipc));
        v
    }

    /// The cross-memory attach offer `m` carries, if it is one.
    pub fn of(m: &Message) -> Option<Attach> {
        let Message::LaneOffer(o) = m else {
            return None;
        };
        let b = &o.bytes;
        if o.lane != LaneId::CMA || b.len() != 30 {
            return None;
        }
        Some(Attach {
            pid: u32::from_le_bytes(b[..4].try_into().unwrap()),
            addr: u64::from_le_bytes(b[4..12].try_into().unwrap()),
            cookie: b[12..28].try_into().unwrap(),
            verdict: match b[28] {
                0 => Verdict::Unknown,
                1 => Verdict::CanPull,
                _ => Verdict::Refused,
            },
            cuda_ipc: b[29] == 1,
        })
    }

    /// As round `round` of the exchange.
    pub fn frame(self, round: u8) -> Message {
        Message::LaneOffer(LaneOffer {
            lane: LaneId::CMA,
            round,
            bytes: self.encode(),
        })
    }
}

/// An active side's attach offer: its nonce (round 0) where `verdict` is
/// `Unknown`, else its verdict and cookie (round 2).
pub fn attach(pid: u32, addr: u64, cookie: [u8; 16], verdict: Verdict) -> Message {
    let round = if verdict == Verdict::Unknown { 0 } else { 2 };
    attach_round(round, pid, addr, cookie, verdict)
}

/// An attach offer as round `round`.
pub fn attach_round(round: u8, pid: u32, addr: u64, cookie: [u8; 16], verdict: Verdict) -> Message {
    Attach {
        pid,
        addr,
        cookie,
        verdict,
        cuda_ipc: false,
    }
    .frame(round)
}

pub fn is_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// A hand-driven connection to a connector's listener.
pub struct Raw {
    pub s: TcpStream,
    pub buf: Vec<u8>,
}

impl Raw {
    pub async fn connect_bare(addr: SocketAddr) -> Raw {
        let s = within(TcpStream::connect(addr)).await.unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new() }
    }

    /// Connects and exchanges hellos.
    pub async fn connect(c: &Connector) -> Raw {
        Raw::connect_as(c, "raw-test-peer").await
    }

    /// Connects and exchanges hellos, as worker `name`.
    pub async fn connect_as(c: &Connector, name: &str) -> Raw {
        let mut r = Raw::connect_bare(c.local_addr()).await;
        r.send(&Message::Hello(Hello {
            version: PROTOCOL_VERSION,
            worker_id: name.into(),
        }))
        .await;
        match r.next().await {
            Some((Message::Hello(h), _)) => assert_eq!(h.worker_id, c.worker_id()),
            other => panic!("expected the connector's hello, got {other:?}"),
        }
        r
    }

    pub async fn send(&mut self, m: &Message) {
        self.s.write_all(&m.to_vec()).await.unwrap();
    }

    /// Writes bytes; the connector may already have closed the connection.
    pub async fn send_raw(&mut self, b: &[u8]) -> io::Result<()> {
        match timeout(STEP, self.s.write_all(b)).await {
            Ok(r) => r,
            Err(_) => panic!("the connector stopped reading"),
        }
    }

    /// The next frame (with its payload, for `Data`), or `None` once the
    /// connector has closed the connection.
    pub async fn next(&mut self) -> Option<(Message, Vec<u8>)> {
        timeout(STEP, self.next_inner())
            .await
            .expect("the connector neither answered nor closed within 2 s")
    }

    async fn next_inner(&mut self) -> Option<(Message, Vec<u8>)> {
        loop {
            match wire::decode_frame(&self.buf) {
                Err(e) => panic!("the connector sent a frame that does not decode: {e}"),
                Ok(Some((msg, used))) => {
                    let plen = match &msg {
                        Message::Data(d) => d.len as usize,
                        _ => 0,
                    };
                    if self.buf.len() >= used + plen {
                        let payload = self.buf[used..used + plen].to_vec();
                        self.buf.drain(..used + plen);
                        return Some((msg, payload));
                    }
                }
                Ok(None) => {}
            }
            let mut tmp = vec![0u8; 64 * 1024];
            match self.s.read(&mut tmp).await {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) if is_closed(&e) => return None,
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    /// Reads until the connector closes the connection; returns what came before.
    pub async fn closed(&mut self) -> Vec<Message> {
        let mut got = Vec::new();
        while let Some((m, _)) = self.next().await {
            got.push(m);
        }
        got
    }

    /// Reads until the connector closes the connection; nothing may come before.
    pub async fn expect_closed(&mut self) {
        let got = self.closed().await;
        assert!(
            got.is_empty(),
            "expected the connection to be closed without a word, got {got:?}"
        );
    }

    pub async fn expect_abort(&mut self, req: u64, reason: AbortReason) -> String {
        match self.next().await {
            Some((Message::Abort(a), _)) => {
                assert_eq!((a.req, a.reason), (req, reason), "{a:?}");
                a.detail
            }
            other => panic!("expected an abort {reason:?} for request {req}, got {other:?}"),
        }
    }

    /// A frame the connector answers at once: once its answer is here, every
    /// frame sent before it has been handled.
    pub async fn barrier(&mut self, req: u64) {
        self.send(&Message::Open(Open {
            req,
            op_id: u64::MAX,
            token: Token::from_bytes([0; 16]),
            kind: OperationKind::Write,
            sizes: vec![1].into(),
            pull: false,
            part: 0,
            parts: 1,
        }))
        .await;
        self.expect_abort(req, AbortReason::UnknownOperation).await;
    }

    /// Nothing arrives for a while (the connection stays open and quiet).
    pub async fn expect_quiet(&mut self, d: Duration) {
        assert!(self.buf.is_empty(), "unexpected bytes {:?}", self.buf);
        let mut tmp = [0u8; 256];
        match timeout(d, self.s.read(&mut tmp)).await {
            Err(_) => {}
            Ok(r) => panic!("expected silence, got {r:?} ({:?})", &tmp[..]),
        }
    }
}

pub async fn expect_attach(r: &mut Raw) -> Attach {
    match r.next().await {
        Some((m, _)) if Attach::of(&m).is_some() => Attach::of(&m).unwrap(),
        other => panic!("expected an attach offer, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// What must still hold after an attack.

/// A separate legitimate WRITE and READ, by another connector with real
/// metadata, still complete on `target`, every byte checked.
pub async fn legit_transfers_still_work(target: &Connector) {
    let peer = connector().await;
    let before = target.exposed_count();

    let data = pattern(3, 70_000);
    let w = target
        .create_writable(vec![vec![0u8; 70_000].into(), vec![0u8; 5].into()])
        .await
        .unwrap();
    let op = peer
        .begin_write(vec![data.clone().into(), vec![9u8; 5].into()], w.metadata())
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    assert_eq!(w.transport(), Some(TransportKind::Tcp));
    let got = w.into_descriptors();
    assert_eq!(got[0].as_slice().unwrap(), &data[..]);
    assert_eq!(got[1].as_slice().unwrap(), &[9u8; 5][..]);

    let r = target
        .create_readable(vec![data.clone().into()])
        .await
        .unwrap();
    let op = peer
        .begin_read(r.metadata(), vec![vec![0u8; 70_000].into()])
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(r.wait_for_completion()).await.unwrap();
    assert_eq!(op.into_descriptors()[0].as_slice().unwrap(), &data[..]);

    assert_eq!(target.exposed_count(), before, "the legit operations ended");
    assert_no_library_panic();
}

/// A legitimate holder of `w`'s metadata can still write it.
pub async fn holder_can_still_write(w: ferry::WritableOperation<'static>) {
    let peer = connector().await;
    let sizes = sizes_of(w.metadata());
    let src: Vec<Descriptor<'static>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| pattern(i as u8, s as usize).into())
        .collect();
    let op = peer.begin_write(src, w.metadata()).await.unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    for (i, (d, &s)) in w.into_descriptors().iter().zip(&sizes).enumerate() {
        assert_eq!(d.as_slice().unwrap(), &pattern(i as u8, s as usize)[..]);
    }
}

/// A legitimate holder of `r`'s metadata can still read it.
pub async fn holder_can_still_read(r: ferry::ReadableOperation<'static>, expected: &[u8]) {
    let peer = connector().await;
    let op = peer
        .begin_read(r.metadata(), vec![vec![0u8; expected.len()].into()])
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(r.wait_for_completion()).await.unwrap();
    assert_eq!(op.into_descriptors()[0].as_slice().unwrap(), expected);
}

pub fn assert_all(d: &Descriptor<'_>, byte: u8, what: &str) {
    let s = d.as_slice().unwrap();
    if let Some(i) = s.iter().position(|&b| b != byte) {
        panic!("{what}: byte {i} is {:#x}, expected {byte:#x}", s[i]);
    }
}

pub async fn expect_errored_protocol(w: &ferry::WritableOperation<'static>) {
    let err = within(w.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::Protocol { .. }), "{err}");
    assert_eq!(w.status(), OperationStatus::Errored);
}

/// Opens `m` on a raw connection and expects `OperationEnded`; Data sent
/// after the refusal must go nowhere.
pub async fn expect_ended(target: &Connector, m: &RdmaMetadata) {
    let mut raw = Raw::connect(target).await;
    raw.send(&open_frame(1, m, m.kind())).await;
    let detail = raw.expect_abort(1, AbortReason::OperationEnded).await;
    assert!(detail.contains("has ended"), "{detail}");
    if m.kind() == OperationKind::Write {
        let _ = raw
            .send_raw(&data_frame(1, 0, 0, &vec![1u8; m.total_size() as usize]))
            .await;
        raw.send(&Message::Finish { req: 1 }).await;
    }
    raw.barrier(2).await;
}

// ---------------------------------------------------------------------------
// The other direction: a hostile passive side. The test listens, answers
// the active connector's hello, and sends it bad frames.

pub const FAKE_WORKER: &str = "fake-passive";

pub async fn fake_passive(
    kind: OperationKind,
    sizes: &[u64],
) -> (tokio::net::TcpListener, RdmaMetadata) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let m = RdmaMetadata::new(
        kind,
        FAKE_WORKER.into(),
        "fake-host".into(),
        "fake-boot-id".into(),
        vec![l.local_addr().unwrap()],
        1,
        Token::from_bytes([7; 16]),
        sizes
            .iter()
            .map(|&size| ferry_proto::DescriptorInfo::new(ferry::Device::CPU, size))
            .collect(),
    )
    .unwrap();
    (l, m)
}

/// Accepts the active side's connection, answers its hello as `worker_id`,
/// and returns the connection and the active side's Open.
pub async fn accept_active(l: &tokio::net::TcpListener, worker_id: &str) -> (Raw, Option<Open>) {
    let (s, _) = within(l.accept()).await.unwrap();
    let mut raw = Raw { s, buf: Vec::new() };
    match raw.next().await {
        Some((Message::Hello(h), _)) => assert_eq!(h.version, PROTOCOL_VERSION),
        other => panic!("expected a hello, got {other:?}"),
    }
    raw.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: worker_id.into(),
    }))
    .await;
    if worker_id != FAKE_WORKER {
        return (raw, None);
    }
    match raw.next().await {
        Some((Message::Open(o), _)) => {
            assert_eq!(o.token.as_bytes(), &[7; 16]);
            (raw, Some(o))
        }
        other => panic!("expected an open, got {other:?}"),
    }
}

/// The active side's next frame, which must be an `Open`.
pub async fn expect_open(r: &mut Raw) -> Open {
    match r.next().await {
        Some((Message::Open(o), _)) => o,
        other => panic!("expected an open, got {other:?}"),
    }
}

/// Accepts a connection from the active side and answers its hello as the
/// fake passive worker (a further stream of a striped transfer, say).
pub async fn accept_hello(l: &tokio::net::TcpListener) -> Raw {
    let (s, _) = within(l.accept()).await.unwrap();
    let mut raw = Raw { s, buf: Vec::new() };
    assert!(matches!(raw.next().await, Some((Message::Hello(_), _))));
    raw.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: FAKE_WORKER.into(),
    }))
    .await;
    raw
}

/// The active connector's other operations, as initiator and as target, go on.
pub async fn active_side_still_works(active: &Connector) {
    let other = connector().await;
    let w = other
        .create_writable(vec![vec![0u8; 1000].into()])
        .await
        .unwrap();
    let op = active
        .begin_write(vec![pattern(4, 1000).into()], w.metadata())
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    legit_transfers_still_work(active).await;
}
