//! Bad input on a real TCP connection to a connector's listener.
//!
//! Each test plays a hostile or broken peer: it opens a plain `TcpStream` to
//! the listener and speaks raw bytes or hand-made `ferry_proto::wire` frames,
//! with tokens and operation ids taken from real metadata. Every test then
//! checks that the connection was answered with the right `Abort` or closed,
//! that nothing in the library panicked, that exposed memory outside what the
//! capability grants is untouched, that the attacked operation is in the
//! state it should be, and that a separate legitimate transfer on the same
//! connector still completes.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

use ferry::{
    AbortReason, Connector, Descriptor, Error, OperationKind, OperationStatus, RdmaMetadata,
    TransportKind,
};
use ferry_proto::wire::{
    self, Abort, Attach, Data, Hello, Lease, Message, Open, Verdict, MAX_BODY, MAX_CHUNK,
    PROTOCOL_VERSION,
};
use ferry_proto::Token;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// How long any single step may take before the test fails.
const STEP: Duration = Duration::from_secs(2);
/// What untouched exposed memory holds.
const UNTOUCHED: u8 = 0xEE;

// ---------------------------------------------------------------------------
// Panic watch: a panic inside the library (in any task) fails the test.

static LIBRARY_PANICS: AtomicUsize = AtomicUsize::new(0);

fn watch_panics() {
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

fn assert_no_library_panic() {
    assert_eq!(
        LIBRARY_PANICS.load(Ordering::SeqCst),
        0,
        "code inside the library panicked (see the panic message above)"
    );
}

// ---------------------------------------------------------------------------
// Helpers.

/// A connector on loopback. Its active operations use TCP only, so that the
/// legitimate transfers of these tests go through the listener under attack
/// even when a faster same-process transport exists, and one stream (the
/// fake passive sides below claim another host, where large transfers would
/// otherwise be striped).
async fn connector() -> Connector {
    watch_panics();
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(1)
        .build()
        .await
        .expect("connector starts")
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    timeout(STEP, f).await.expect("step took more than 2 s")
}

fn untouched(size: usize) -> Descriptor<'static> {
    vec![UNTOUCHED; size].into()
}

fn pattern(size: usize, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sizes_of(m: &RdmaMetadata) -> Vec<u64> {
    m.descriptors().iter().map(|d| d.size).collect()
}

fn open_frame(req: u64, m: &RdmaMetadata, kind: OperationKind) -> Message {
    Message::Open(Open {
        req,
        op_id: m.operation_id(),
        token: *m.token(),
        kind,
        sizes: sizes_of(m),
        pull: false,
        part: 0,
        parts: 1,
    })
}

/// The `Open` of part `part` of `parts` of a striped transfer.
fn part_open(req: u64, m: &RdmaMetadata, kind: OperationKind, part: u16, parts: u16) -> Message {
    let Message::Open(o) = open_frame(req, m, kind) else {
        unreachable!()
    };
    Message::Open(Open { part, parts, ..o })
}

/// A `Data` frame followed by its payload.
fn data_frame(req: u64, desc: u32, offset: u64, payload: &[u8]) -> Vec<u8> {
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

fn header(ty: u8, body_len: u32) -> Vec<u8> {
    let mut v = vec![ty, 0, 0, 0];
    v.extend_from_slice(&body_len.to_le_bytes());
    v
}

/// Deterministic pseudo-random bytes.
fn noise(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

fn is_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// A hand-driven connection to a connector's listener.
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    async fn connect_bare(addr: SocketAddr) -> Raw {
        let s = within(TcpStream::connect(addr)).await.unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new() }
    }

    /// Connects and exchanges hellos.
    async fn connect(c: &Connector) -> Raw {
        Raw::connect_as(c, "raw-test-peer").await
    }

    /// Connects and exchanges hellos, as worker `name`.
    async fn connect_as(c: &Connector, name: &str) -> Raw {
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

    async fn send(&mut self, m: &Message) {
        self.s.write_all(&m.to_vec()).await.unwrap();
    }

    /// Writes bytes; the connector may already have closed the connection.
    async fn send_raw(&mut self, b: &[u8]) -> io::Result<()> {
        match timeout(STEP, self.s.write_all(b)).await {
            Ok(r) => r,
            Err(_) => panic!("the connector stopped reading"),
        }
    }

    /// The next frame (with its payload, for `Data`), or `None` once the
    /// connector has closed the connection.
    async fn next(&mut self) -> Option<(Message, Vec<u8>)> {
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
    async fn closed(&mut self) -> Vec<Message> {
        let mut got = Vec::new();
        while let Some((m, _)) = self.next().await {
            got.push(m);
        }
        got
    }

    /// Reads until the connector closes the connection; nothing may come before.
    async fn expect_closed(&mut self) {
        let got = self.closed().await;
        assert!(
            got.is_empty(),
            "expected the connection to be closed without a word, got {got:?}"
        );
    }

    async fn expect_abort(&mut self, req: u64, reason: AbortReason) -> String {
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
    async fn barrier(&mut self, req: u64) {
        self.send(&Message::Open(Open {
            req,
            op_id: u64::MAX,
            token: Token::from_bytes([0; 16]),
            kind: OperationKind::Write,
            sizes: vec![1],
            pull: false,
            part: 0,
            parts: 1,
        }))
        .await;
        self.expect_abort(req, AbortReason::UnknownOperation).await;
    }

    /// Nothing arrives for a while (the connection stays open and quiet).
    async fn expect_quiet(&mut self, d: Duration) {
        assert!(self.buf.is_empty(), "unexpected bytes {:?}", self.buf);
        let mut tmp = [0u8; 256];
        match timeout(d, self.s.read(&mut tmp)).await {
            Err(_) => {}
            Ok(r) => panic!("expected silence, got {r:?} ({:?})", &tmp[..]),
        }
    }
}

/// A separate legitimate WRITE and READ, by another connector with real
/// metadata, still complete on `target`, every byte checked.
async fn legit_transfers_still_work(target: &Connector) {
    let peer = connector().await;
    let before = target.exposed_count();

    let data = pattern(70_000, 3);
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
async fn holder_can_still_write(w: ferry::WritableOperation<'static>) {
    let peer = connector().await;
    let sizes = sizes_of(w.metadata());
    let src: Vec<Descriptor<'static>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| pattern(s as usize, i as u8).into())
        .collect();
    let op = peer.begin_write(src, w.metadata()).await.unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    for (i, (d, &s)) in w.into_descriptors().iter().zip(&sizes).enumerate() {
        assert_eq!(d.as_slice().unwrap(), &pattern(s as usize, i as u8)[..]);
    }
}

/// A legitimate holder of `r`'s metadata can still read it.
async fn holder_can_still_read(r: ferry::ReadableOperation<'static>, expected: &[u8]) {
    let peer = connector().await;
    let op = peer
        .begin_read(r.metadata(), vec![vec![0u8; expected.len()].into()])
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(r.wait_for_completion()).await.unwrap();
    assert_eq!(op.into_descriptors()[0].as_slice().unwrap(), expected);
}

fn assert_all(d: &Descriptor<'_>, byte: u8, what: &str) {
    let s = d.as_slice().unwrap();
    if let Some(i) = s.iter().position(|&b| b != byte) {
        panic!("{what}: byte {i} is {:#x}, expected {byte:#x}", s[i]);
    }
}

async fn expect_errored_protocol(w: &ferry::WritableOperation<'static>) {
    let err = within(w.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::Protocol { .. }), "{err}");
    assert_eq!(w.status(), OperationStatus::Errored);
}

// ---------------------------------------------------------------------------
// Before the hello.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_on_the_listener_port_are_dropped() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let meta = w.metadata().clone();
    let mut bad_magic = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "x".into(),
    })
    .to_vec();
    bad_magic[wire::HEADER_LEN] = b'X';
    let mut bad_utf8 = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "ab".into(),
    })
    .to_vec();
    let n = bad_utf8.len();
    bad_utf8[n - 1] = 0xff;
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        (
            "http request",
            b"GET / HTTP/1.1\r\nHost: ferry\r\n\r\n".to_vec(),
        ),
        ("random bytes", noise(4096, 7)),
        ("zeros", vec![0u8; 64]),
        ("hello with bad magic", bad_magic),
        ("hello with invalid utf-8 worker id", bad_utf8),
        (
            "hello of another protocol version",
            Message::Hello(Hello {
                version: PROTOCOL_VERSION + 1,
                worker_id: "x".into(),
            })
            .to_vec(),
        ),
        (
            // A valid Open with the real token, but no hello first.
            "open before hello",
            open_frame(1, &meta, OperationKind::Write).to_vec(),
        ),
    ];
    for (what, bytes) in inputs {
        let mut raw = Raw::connect_bare(target.local_addr()).await;
        let _ = raw.send_raw(&bytes).await;
        let got = raw.closed().await;
        assert!(
            got.is_empty(),
            "{what}: no hello may come back, got {got:?}"
        );
    }
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "exposed buffer");
    legit_transfers_still_work(&target).await;
}

/// A connection that says nothing, or half a hello, is dropped after the
/// 10 s hello timeout (virtual time: the test runs in milliseconds).
#[tokio::test(start_paused = true)]
async fn silent_connection_is_dropped_after_the_hello_timeout() {
    let target = connector().await;
    for prefix in [&[][..], &[1u8, 0, 0][..]] {
        let mut raw = Raw::connect_bare(target.local_addr()).await;
        raw.send_raw(prefix).await.unwrap();
        let start = tokio::time::Instant::now();
        let mut tmp = [0u8; 16];
        let r = timeout(Duration::from_secs(60), raw.s.read(&mut tmp))
            .await
            .expect("the connector drops a silent connection");
        assert!(
            matches!(r, Ok(0)) || r.as_ref().is_err_and(is_closed),
            "{r:?}"
        );
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
            "dropped after {waited:?}"
        );
    }
    tokio::time::resume();
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Framing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_the_hello_closes_the_connection() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", noise(1000, 99)),
        ("unknown frame type", header(9, 0)),
        ("frame type zero", header(0, 8)),
        ("reserved header bytes set", vec![4, 1, 0, 0, 8, 0, 0, 0]),
        (
            "a second hello",
            Message::Hello(Hello {
                version: PROTOCOL_VERSION,
                worker_id: "again".into(),
            })
            .to_vec(),
        ),
        ("finish with a trailing byte", {
            let mut v = header(4, 9);
            v.extend_from_slice(&[0; 9]);
            v
        }),
        ("open with zero descriptors", {
            let mut body = vec![0u8; 8 + 8 + 16];
            body.push(2);
            body.extend_from_slice(&0u32.to_le_bytes());
            let mut v = header(2, body.len() as u32);
            v.extend_from_slice(&body);
            v
        }),
        ("open with kind 3", {
            let mut body = vec![0u8; 8 + 8 + 16];
            body.push(3);
            body.extend_from_slice(&1u32.to_le_bytes());
            body.extend_from_slice(&64u64.to_le_bytes());
            let mut v = header(2, body.len() as u32);
            v.extend_from_slice(&body);
            v
        }),
    ];
    for (what, bytes) in inputs {
        let mut raw = Raw::connect(&target).await;
        let _ = raw.send_raw(&bytes).await;
        let got = raw.closed().await;
        assert!(
            got.is_empty(),
            "{what}: expected a plain close, got {got:?}"
        );
    }
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "exposed buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_body_length_closes_the_connection_at_once() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    for ty in 1..=5u8 {
        for len in [u32::MAX, MAX_BODY + 1, 1 << 31] {
            // After the hello, and in place of the hello.
            let mut raw = Raw::connect(&target).await;
            let _ = raw.send_raw(&header(ty, len)).await;
            raw.expect_closed().await;
            let mut raw = Raw::connect_bare(target.local_addr()).await;
            let _ = raw.send_raw(&header(ty, len)).await;
            raw.expect_closed().await;
        }
    }
    // A Data frame may announce at most MAX_CHUNK payload bytes.
    let mut raw = Raw::connect(&target).await;
    let _ = raw
        .send_raw(
            &Message::Data(Data {
                req: 1,
                desc: 0,
                offset: 0,
                len: MAX_CHUNK + 1,
            })
            .to_vec(),
        )
        .await;
    raw.expect_closed().await;
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "exposed buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frame_then_close() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let meta = w.metadata().clone();

    // Half a header, half an Open (with the real token), and a header that
    // announces more body than ever comes: then the write side is closed.
    let open = open_frame(1, &meta, OperationKind::Write).to_vec();
    let mut long = header(2, MAX_BODY);
    long.extend_from_slice(&[0; 100]);
    for bytes in [vec![2u8, 0, 0], open[..open.len() / 2].to_vec(), long] {
        let mut raw = Raw::connect(&target).await;
        raw.send_raw(&bytes).await.unwrap();
        raw.s.shutdown().await.unwrap();
        raw.expect_closed().await;
    }
    assert_eq!(w.status(), OperationStatus::Initialized, "never opened");

    // An opened WRITE whose Data payload stops half-way: the bytes that
    // came lie inside the grant; the operation fails; nothing else changes.
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, &meta, OperationKind::Write)).await;
    let mut d = Message::Data(Data {
        req: 1,
        desc: 0,
        offset: 0,
        len: 64,
    })
    .to_vec();
    d.extend_from_slice(&[1u8; 20]);
    raw.send_raw(&d).await.unwrap();
    raw.s.shutdown().await.unwrap();
    raw.expect_closed().await;
    let err = within(w.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    assert_eq!(w.status(), OperationStatus::Errored);
    assert_eq!(target.exposed_count(), 0);
    let got = w.into_descriptors();
    let s = got[0].as_slice().unwrap();
    assert!(s[..20].iter().all(|&b| b == 1), "{s:?}");
    assert!(s[20..].iter().all(|&b| b == UNTOUCHED), "{s:?}");
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Data that the capability does not cover.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_a_request_never_opened_is_skipped() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let w2 = target.create_writable(vec![untouched(100)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    // Data for requests that were never opened (or were aborted): the
    // payload is read and thrown away, whatever its header says.
    let mut bytes = data_frame(77, 0, 0, &[1u8; 1000]);
    bytes.extend(data_frame(78, u32::MAX, u64::MAX, &vec![2u8; 1 << 20]));
    bytes.extend(Message::Finish { req: 77 }.to_vec());
    bytes.extend(
        Message::Abort(Abort {
            req: 79,
            reason: AbortReason::Cancelled,
            detail: String::new(),
        })
        .to_vec(),
    );
    raw.send_raw(&bytes).await.unwrap();
    // The stream is still in step: a proper WRITE on the same connection works.
    raw.send(&open_frame(1, w2.metadata(), OperationKind::Write))
        .await;
    raw.send_raw(&data_frame(1, 0, 0, &[5u8; 100]))
        .await
        .unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    match raw.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w2.wait_for_completion()).await.unwrap();
    assert_all(&w2.into_descriptors()[0], 5, "written buffer");
    assert_eq!(w.status(), OperationStatus::Initialized);
    raw.expect_quiet(Duration::from_millis(50)).await;
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "other exposed buffer");
    legit_transfers_still_work(&target).await;
}

/// Opens a WRITE of the writable [32, 16] with the real token, sends
/// `frames`, and checks that the connector closes the connection, errors the
/// operation, and that only the first `landed` bytes of descriptor 0 changed
/// (to 1).
async fn bad_data_case(frames: Vec<u8>, landed: usize) {
    let target = connector().await;
    let w = target
        .create_writable(vec![untouched(32), untouched(16)])
        .await
        .unwrap();
    let bystander = target.create_writable(vec![untouched(32)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    let _ = raw.send_raw(&frames).await;
    raw.expect_closed().await;
    expect_errored_protocol(&w).await;
    assert_eq!(target.exposed_count(), 1, "only the bystander is left");
    let got = w.into_descriptors();
    let s = got[0].as_slice().unwrap();
    assert!(s[..landed].iter().all(|&b| b == 1), "{s:?}");
    assert!(s[landed..].iter().all(|&b| b == UNTOUCHED), "{s:?}");
    assert_all(&got[1], UNTOUCHED, "descriptor 1");
    assert_eq!(bystander.status(), OperationStatus::Initialized);
    holder_can_still_write(bystander).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_past_the_end_of_a_descriptor_is_refused() {
    bad_data_case(data_frame(1, 0, 0, &[1u8; 33]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_at_an_offset_past_the_end_is_refused() {
    bad_data_case(data_frame(1, 0, 32, &[1u8; 1]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_whose_offset_plus_length_overflows_is_refused() {
    bad_data_case(data_frame(1, 0, u64::MAX - 7, &[1u8; 16]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_at_offset_u64_max_is_refused() {
    bad_data_case(data_frame(1, 0, u64::MAX, &[1u8; 1]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_a_descriptor_that_does_not_exist_is_refused() {
    bad_data_case(data_frame(1, 2, 0, &[1u8; 1]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_descriptor_u32_max_is_refused() {
    bad_data_case(data_frame(1, u32::MAX, 0, &[1u8; 1]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_with_a_gap_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 8]);
    f.extend(data_frame(1, 0, 16, &[1u8; 8]));
    bad_data_case(f, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_going_back_over_written_bytes_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 8]);
    f.extend(data_frame(1, 0, 4, &[1u8; 8]));
    bad_data_case(f, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_jumping_to_the_next_descriptor_early_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 8]);
    f.extend(data_frame(1, 1, 0, &[1u8; 8]));
    bad_data_case(f, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_of_length_zero_is_refused() {
    bad_data_case(data_frame(1, 0, 0, &[]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_before_all_data_is_refused() {
    let mut f = data_frame(1, 0, 0, &[1u8; 32]);
    f.extend(Message::Finish { req: 1 }.to_vec());
    bad_data_case(f, 32).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_sent_into_a_read_is_refused() {
    let target = connector().await;
    let secret = pattern(32, 40);
    let r = target
        .create_readable(vec![secret.clone().into()])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, r.metadata(), OperationKind::Read))
        .await;
    let _ = raw.send_raw(&data_frame(1, 0, 0, &[1u8; 32])).await;
    // The connector may have started to stream the readable before it saw
    // the Data; whatever came, the connection ends and the read fails.
    for m in raw.closed().await {
        assert!(
            matches!(m, Message::Data(_) | Message::Finish { req: 1 }),
            "{m:?}"
        );
    }
    let err = within(r.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::Protocol { .. }), "{err}");
    assert_eq!(r.status(), OperationStatus::Errored);
    assert_eq!(r.into_descriptors()[0].as_slice().unwrap(), &secret[..]);
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Capabilities.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_token_with_the_wrong_kind_or_shape_is_refused() {
    let target = connector().await;
    let w = target
        .create_writable(vec![untouched(16), untouched(8)])
        .await
        .unwrap();
    let secret = pattern(24, 8);
    let r = target
        .create_readable(vec![secret.clone().into()])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;

    // READ against a writable, WRITE against a readable.
    raw.send(&open_frame(1, w.metadata(), OperationKind::Read))
        .await;
    let detail = raw.expect_abort(1, AbortReason::WrongKind).await;
    assert!(detail.contains("WritableOperation"), "{detail}");
    raw.send(&open_frame(2, r.metadata(), OperationKind::Write))
        .await;
    raw.expect_abort(2, AbortReason::WrongKind).await;
    // Data that follows a refused Open is skipped, not written.
    let _ = raw.send_raw(&data_frame(2, 0, 0, &[1u8; 24])).await;

    // Right token and kind, wrong count or sizes.
    let shapes: Vec<(Vec<u64>, AbortReason)> = vec![
        (vec![16], AbortReason::CountMismatch),
        (vec![16, 8, 1], AbortReason::CountMismatch),
        (
            vec![1; ferry_proto::MAX_DESCRIPTORS],
            AbortReason::CountMismatch,
        ),
        (vec![16, 9], AbortReason::SizeMismatch),
        (vec![u64::MAX, 8], AbortReason::SizeMismatch),
    ];
    for (i, (sizes, reason)) in shapes.into_iter().enumerate() {
        let req = 10 + i as u64;
        raw.send(&Message::Open(Open {
            req,
            op_id: w.metadata().operation_id(),
            token: *w.metadata().token(),
            kind: OperationKind::Write,
            sizes,
            pull: false,
            part: 0,
            parts: 1,
        }))
        .await;
        raw.expect_abort(req, reason).await;
    }
    // Neither operation was started nor consumed by the refusals.
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_eq!(r.status(), OperationStatus::Initialized);
    raw.expect_quiet(Duration::from_millis(50)).await;
    holder_can_still_write(w).await;
    holder_can_still_read(r, &secret).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_is_refused_and_does_not_burn_the_capability() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let other = target.create_writable(vec![untouched(64)]).await.unwrap();
    let good = *w.metadata().token().as_bytes();
    let mut one_bit = good;
    one_bit[15] ^= 1;
    let tokens = [
        one_bit,
        [0u8; 16],
        [0xff; 16],
        *other.metadata().token().as_bytes(),
    ];
    let mut raw = Raw::connect(&target).await;
    for (i, t) in tokens.into_iter().enumerate() {
        let req = i as u64 + 1;
        raw.send(&Message::Open(Open {
            req,
            op_id: w.metadata().operation_id(),
            token: Token::from_bytes(t),
            kind: OperationKind::Write,
            sizes: vec![64],
            pull: false,
            part: 0,
            parts: 1,
        }))
        .await;
        let detail = raw.expect_abort(req, AbortReason::UnknownOperation).await;
        assert!(detail.is_empty(), "{detail}");
        // Data after the refusal goes nowhere.
        let _ = raw.send_raw(&data_frame(req, 0, 0, &[1u8; 64])).await;
    }
    raw.barrier(100).await;
    assert_eq!(w.status(), OperationStatus::Initialized);
    assert_eq!(other.status(), OperationStatus::Initialized);
    assert_all(&other.into_descriptors()[0], UNTOUCHED, "other buffer");
    holder_can_still_write(w).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_token_all_get_the_same_refusal() {
    let target = connector().await;
    let live = target.create_writable(vec![untouched(8)]).await.unwrap();
    let ended = target.create_writable(vec![untouched(8)]).await.unwrap();
    let ended_meta = ended.metadata().clone();
    drop(ended);
    // A striped WRITE that failed: its peer ("owner") bound part 0 of 2,
    // then lost its connection; the end's cause is kept for that peer.
    let striped = target.create_writable(vec![untouched(10)]).await.unwrap();
    let sm = striped.metadata().clone();
    let mut owner = Raw::connect_as(&target, "owner").await;
    owner
        .send(&part_open(1, &sm, OperationKind::Write, 0, 2))
        .await;
    owner.barrier(2).await;
    drop(owner);
    within(async {
        while !striped.status().is_terminal() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;

    let wrong = Token::from_bytes([0x5A; 16]);
    let (live_id, ended_id, striped_id) = (
        live.metadata().operation_id(),
        ended_meta.operation_id(),
        sm.operation_id(),
    );
    let cases = [
        // Never issued.
        (0, wrong, 1),
        (striped_id + 1, wrong, 1),
        (u64::MAX, wrong, 1),
        // Live, with a wrong token, or the token of another operation.
        (live_id, wrong, 1),
        (live_id, *ended_meta.token(), 1),
        // Ended.
        (ended_id, wrong, 1),
        (ended_id, *live.metadata().token(), 1),
        // Ended striped, whose cause is stored.
        (striped_id, wrong, 2),
        (striped_id, wrong, 1),
    ];
    let mut raw = Raw::connect_as(&target, "stranger").await;
    for (i, (op_id, token, parts)) in cases.into_iter().enumerate() {
        let req = i as u64 + 1;
        raw.send(&Message::Open(Open {
            req,
            op_id,
            token,
            kind: OperationKind::Write,
            sizes: vec![8],
            pull: false,
            part: parts - 1,
            parts,
        }))
        .await;
        match raw.next().await {
            Some((Message::Abort(a), _)) => assert_eq!(
                (a.req, a.reason, a.detail.as_str()),
                (req, AbortReason::UnknownOperation, ""),
                "case {i}: op {op_id}, {parts} part(s): a refusal without a valid token must \
                 not tell live, ended and unknown operations apart"
            ),
            other => panic!("case {i}: expected an abort, got {other:?}"),
        }
    }
    // Whoever holds an ended operation's token learns that it ended...
    let req = 100;
    raw.send(&open_frame(req, &ended_meta, OperationKind::Write))
        .await;
    let detail = raw.expect_abort(req, AbortReason::OperationEnded).await;
    assert!(detail.contains("has ended"), "{detail}");
    // ... but how a striped one failed is told to its own peer only.
    raw.send(&part_open(101, &sm, OperationKind::Write, 1, 2))
        .await;
    let detail = raw.expect_abort(101, AbortReason::OperationEnded).await;
    assert!(detail.contains("has ended"), "{detail}");
    let mut owner = Raw::connect_as(&target, "owner").await;
    owner
        .send(&part_open(1, &sm, OperationKind::Write, 1, 2))
        .await;
    let detail = owner.expect_abort(1, AbortReason::PartFailed).await;
    assert!(!detail.is_empty(), "the owner is told the cause");

    assert_eq!(live.status(), OperationStatus::Initialized);
    holder_can_still_write(live).await;
    legit_transfers_still_work(&target).await;
}

/// Opens `m` on a raw connection and expects `OperationEnded`; Data sent
/// after the refusal must go nowhere.
async fn expect_ended(target: &Connector, m: &RdmaMetadata) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_a_completed_operation_is_refused() {
    let target = connector().await;
    let peer = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let op = peer
        .begin_write(vec![vec![7u8; 64].into()], w.metadata())
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    let secret = pattern(64, 1);
    let r = target
        .create_readable(vec![secret.clone().into()])
        .await
        .unwrap();
    let op = peer
        .begin_read(r.metadata(), vec![vec![0u8; 64].into()])
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(r.wait_for_completion()).await.unwrap();

    expect_ended(&target, w.metadata()).await;
    expect_ended(&target, r.metadata()).await;
    // The peer that completed them cannot use them again either.
    let again = peer
        .begin_write(vec![vec![8u8; 64].into()], w.metadata())
        .await
        .unwrap();
    let err = within(again.wait_for_completion()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::OperationEnded,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(w.status(), OperationStatus::Complete);
    assert_eq!(r.status(), OperationStatus::Complete);
    assert_all(&w.into_descriptors()[0], 7, "completed buffer");
    assert_eq!(target.exposed_count(), 0);
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_a_cancelled_operation_is_refused() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let r = target
        .create_readable(vec![pattern(64, 2).into()])
        .await
        .unwrap();
    w.cancel();
    r.cancel();
    expect_ended(&target, w.metadata()).await;
    expect_ended(&target, r.metadata()).await;
    assert_eq!(w.status(), OperationStatus::Cancelled);
    assert_eq!(r.status(), OperationStatus::Cancelled);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "cancelled buffer");
    assert_eq!(target.exposed_count(), 0);
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_a_dropped_operation_is_refused() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let r = target
        .create_readable(vec![pattern(64, 2).into()])
        .await
        .unwrap();
    let (wm, rm) = (w.metadata().clone(), r.metadata().clone());
    drop(w);
    drop(r);
    assert_eq!(target.exposed_count(), 0);
    expect_ended(&target, &wm).await;
    expect_ended(&target, &rm).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_an_operation_cancelled_mid_transfer_is_refused() {
    let target = connector().await;
    let w = target
        .create_writable(vec![untouched(64), untouched(64)])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    raw.send_raw(&data_frame(1, 0, 0, &[1u8; 64]))
        .await
        .unwrap();
    raw.barrier(2).await;
    assert_eq!(w.status(), OperationStatus::InProgress);
    w.cancel();
    // The owner's cancel reaches the remote...
    raw.expect_abort(1, AbortReason::Cancelled).await;
    // ...and the rest of the remote's data, and its Finish, go nowhere.
    raw.send_raw(&data_frame(1, 1, 0, &[1u8; 64]))
        .await
        .unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    raw.barrier(3).await;
    raw.expect_quiet(Duration::from_millis(50)).await;
    expect_ended(&target, w.metadata()).await;
    assert_eq!(w.status(), OperationStatus::Cancelled);
    let got = w.into_descriptors();
    assert_all(&got[0], 1, "descriptor written before the cancel");
    assert_all(&got[1], UNTOUCHED, "descriptor after the cancel");
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Replays.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_finish_is_ignored() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    raw.send_raw(&data_frame(1, 0, 0, &[3u8; 64]))
        .await
        .unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    match raw.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w.wait_for_completion()).await.unwrap();
    // The same Finish again, and a Finish for a request never opened.
    raw.send(&Message::Finish { req: 1 }).await;
    raw.send(&Message::Finish { req: 999 }).await;
    raw.barrier(2).await;
    raw.expect_quiet(Duration::from_millis(50)).await;
    // The request number is free again, but the operation is over.
    raw.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    raw.expect_abort(1, AbortReason::OperationEnded).await;
    assert_eq!(w.status(), OperationStatus::Complete);
    assert_all(&w.into_descriptors()[0], 3, "written buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_read_confirmation_is_ignored() {
    let target = connector().await;
    let secret = pattern(100, 5);
    let r = target
        .create_readable(vec![secret.clone().into()])
        .await
        .unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, r.metadata(), OperationKind::Read))
        .await;
    match raw.next().await {
        Some((Message::Data(d), payload)) => {
            assert_eq!((d.req, d.desc, d.offset, d.len), (1, 0, 0, 100));
            assert_eq!(payload, secret);
        }
        other => panic!("expected the data, got {other:?}"),
    }
    match raw.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected finish, got {other:?}"),
    }
    raw.send(&Message::Finish { req: 1 }).await;
    within(r.wait_for_completion()).await.unwrap();
    raw.send(&Message::Finish { req: 1 }).await;
    raw.barrier(2).await;
    raw.expect_quiet(Duration::from_millis(50)).await;
    assert_eq!(r.status(), OperationStatus::Complete);
    expect_ended(&target, r.metadata()).await;
    legit_transfers_still_work(&target).await;
}

/// A reader's `Finish` confirms that every byte arrived; sent before the
/// readable has even sent them all, it is a lie the passive side can see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_confirmation_before_all_data_is_refused() {
    let target = connector().await;
    let r = target
        .create_readable(vec![vec![0x11u8; 8 << 20].into()])
        .await
        .unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = within(sock.connect(target.local_addr())).await.unwrap();
    let mut raw = Raw { s, buf: Vec::new() };
    raw.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "early-confirmer".into(),
    }))
    .await;
    raw.send(&open_frame(1, r.metadata(), OperationKind::Read))
        .await;
    // Confirm at once, without reading a byte of the 8 MiB.
    raw.send(&Message::Finish { req: 1 }).await;
    let outcome = within(r.wait_for_completion()).await;
    assert!(
        matches!(outcome, Err(Error::Protocol { .. })),
        "the readable ended with {outcome:?} ({})",
        r.status()
    );
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_for_an_operation_completed_on_another_connection_is_ignored() {
    let target = connector().await;
    let peer = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let op = peer
        .begin_write(vec![vec![4u8; 64].into()], w.metadata())
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    // Another connection replays completions for the request numbers the
    // legitimate peer used: requests are per connection, so they match nothing.
    let mut raw = Raw::connect(&target).await;
    for req in [0, 1, 2, u64::MAX] {
        raw.send(&Message::Finish { req }).await;
    }
    raw.barrier(3).await;
    raw.expect_quiet(Duration::from_millis(50)).await;
    assert_eq!(w.status(), OperationStatus::Complete);
    assert_all(&w.into_descriptors()[0], 4, "written buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_request_number_closes_the_connection() {
    let target = connector().await;
    let w1 = target.create_writable(vec![untouched(64)]).await.unwrap();
    let w2 = target.create_writable(vec![untouched(64)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(5, w1.metadata(), OperationKind::Write))
        .await;
    raw.barrier(6).await;
    assert_eq!(w1.status(), OperationStatus::InProgress);
    let _ = raw
        .send_raw(&open_frame(5, w2.metadata(), OperationKind::Write).to_vec())
        .await;
    raw.expect_closed().await;
    // The operation bound to the connection fails; the one named by the
    // offending Open was never touched and is still usable.
    expect_errored_protocol(&w1).await;
    assert_all(&w1.into_descriptors()[0], UNTOUCHED, "first buffer");
    assert_eq!(w2.status(), OperationStatus::Initialized);
    holder_can_still_write(w2).await;
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_open_of_an_operation_in_progress_is_busy() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let mut first = Raw::connect(&target).await;
    first
        .send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    first.barrier(2).await;
    // Someone else with the same metadata, on another connection and on the same.
    let mut second = Raw::connect(&target).await;
    second
        .send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    second.expect_abort(1, AbortReason::Busy).await;
    let _ = second.send_raw(&data_frame(1, 0, 0, &[9u8; 64])).await;
    second.barrier(2).await;
    first
        .send(&open_frame(3, w.metadata(), OperationKind::Write))
        .await;
    first.expect_abort(3, AbortReason::Busy).await;
    // The first remote finishes its transfer undisturbed.
    first
        .send_raw(&data_frame(1, 0, 0, &[6u8; 64]))
        .await
        .unwrap();
    first.send(&Message::Finish { req: 1 }).await;
    match first.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w.wait_for_completion()).await.unwrap();
    assert_all(&w.into_descriptors()[0], 6, "written buffer");
    legit_transfers_still_work(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_from_the_remote_ends_only_its_operation() {
    let target = connector().await;
    let w1 = target.create_writable(vec![untouched(64)]).await.unwrap();
    let w2 = target.create_writable(vec![untouched(64)]).await.unwrap();
    let mut raw = Raw::connect(&target).await;
    raw.send(&open_frame(1, w1.metadata(), OperationKind::Write))
        .await;
    raw.send(&open_frame(2, w2.metadata(), OperationKind::Write))
        .await;
    for (req, reason) in [
        (1, AbortReason::Cancelled),
        (2, AbortReason::Other(200)),
        (3, AbortReason::Protocol),
    ] {
        raw.send(&Message::Abort(Abort {
            req,
            reason,
            detail: "x".repeat(wire::MAX_DETAIL),
        }))
        .await;
    }
    raw.barrier(4).await;
    let err = within(w1.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::RemoteCancelled), "{err}");
    assert_eq!(w1.status(), OperationStatus::Cancelled);
    let err = within(w2.wait_for_completion()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::Other(200),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(w2.status(), OperationStatus::Errored);
    expect_ended(&target, w1.metadata()).await;
    assert_all(&w1.into_descriptors()[0], UNTOUCHED, "first buffer");
    assert_all(&w2.into_descriptors()[0], UNTOUCHED, "second buffer");
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// Load from one peer.

/// A peer that sends Opens as fast as it can and never reads the replies is
/// cut off once 4096 replies are queued; the capability it aimed at is
/// untouched and other connections go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_of_opens_without_reading_replies_is_cut_off() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    // A small receive buffer so that the replies back up quickly.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = within(sock.connect(target.local_addr())).await.unwrap();
    let mut raw = Raw { s, buf: Vec::new() };
    raw.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "flooder".into(),
    }))
    .await;
    // READ against the writable: refused with WrongKind and a long detail.
    let mut batch = Vec::new();
    for req in 0..2000 {
        open_frame(req, w.metadata(), OperationKind::Read).encode(&mut batch);
    }
    let mut sent = 0usize;
    let cut_off = timeout(Duration::from_secs(10), async {
        loop {
            match raw.s.write_all(&batch).await {
                Ok(()) => sent += 2000,
                Err(e) if is_closed(&e) => return,
                Err(e) => panic!("write failed: {e}"),
            }
        }
    })
    .await;
    assert!(
        cut_off.is_ok(),
        "the connector kept serving a peer that never reads ({sent} opens sent)"
    );
    assert!(sent >= 4096, "cut off after only {sent} opens");
    // Whatever replies made it, the connection is over.
    for m in raw.closed().await {
        assert!(
            matches!(
                m,
                Message::Hello(_)
                    | Message::Abort(Abort {
                        reason: AbortReason::WrongKind,
                        ..
                    })
            ),
            "{m:?}"
        );
    }
    assert_eq!(w.status(), OperationStatus::Initialized);
    holder_can_still_write(w).await;
    legit_transfers_still_work(&target).await;
}

/// A peer that opens a large READ and then stops reading holds its own
/// connection's write side; the owner's cancel still fences it out at once:
/// the memory comes back while the transport is blocked mid-chunk, and not
/// one byte of it is read afterwards (the rest of the chunk goes out as zeros).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_reader_is_fenced_out_by_cancel() {
    const SIZE: usize = 32 << 20;
    let target = connector().await;
    let r = target
        .create_readable(vec![vec![0x11u8; SIZE].into()])
        .await
        .unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = within(sock.connect(target.local_addr())).await.unwrap();
    let mut raw = Raw { s, buf: Vec::new() };
    raw.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "stalled-reader".into(),
    }))
    .await;
    raw.send(&open_frame(1, r.metadata(), OperationKind::Read))
        .await;
    // Let the connector fill the socket and block.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.status(), OperationStatus::InProgress);
    // Other connections are not held up by the stalled one.
    legit_transfers_still_work(&target).await;

    r.cancel();
    assert_eq!(r.status(), OperationStatus::Cancelled);
    let mut back = r.into_descriptors();
    back[0].as_mut_slice().unwrap().fill(0xAA);

    // Now drain: pattern bytes sent before the cancel, then zeros, then an
    // Abort; never a byte written after the memory came back.
    let (mut pattern_bytes, mut zeros) = (0usize, 0usize);
    let mut aborted = false;
    while let Some((m, payload)) = raw.next().await {
        match m {
            Message::Hello(_) => {}
            Message::Data(d) => {
                assert_eq!(d.req, 1);
                assert!(!aborted, "data after the abort");
                for b in payload {
                    match b {
                        0x11 => pattern_bytes += 1,
                        0 => zeros += 1,
                        other => panic!("byte {other:#x} read after the cancel"),
                    }
                }
            }
            Message::Abort(a) => {
                // Both the owner's withdrawal and the interrupted stream say
                // so; the second is redundant but harmless.
                assert_eq!((a.req, a.reason), (1, AbortReason::Cancelled));
                aborted = true;
                if raw.buf.is_empty()
                    && timeout(Duration::from_millis(50), raw.s.readable())
                        .await
                        .is_err()
                {
                    break;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(aborted, "the reader is told of the cancel");
    assert!(pattern_bytes < SIZE, "the cancel cut the stream short");
    assert!(back[0].as_slice().unwrap().iter().all(|&b| b == 0xAA));
    assert_eq!(target.exposed_count(), 0);
    // Chunks are 2 MiB; unless the cancel fell between two of them, the
    // rest of the interrupted one went out as zeros.
    assert!(zeros > 0 || pattern_bytes % (2 << 20) == 0, "{zeros}");
    legit_transfers_still_work(&target).await;
}

// ---------------------------------------------------------------------------
// The other direction: a hostile passive side. The test listens, answers
// the active connector's hello, and sends it bad frames.

const FAKE_WORKER: &str = "fake-passive";

async fn fake_passive(
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
            .map(|&size| ferry_proto::DescriptorInfo {
                device: ferry::Device::CPU,
                size,
            })
            .collect(),
    )
    .unwrap();
    (l, m)
}

/// Accepts the active side's connection, answers its hello as `worker_id`,
/// and returns the connection and the active side's Open.
async fn accept_active(l: &tokio::net::TcpListener, worker_id: &str) -> (Raw, Option<Open>) {
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

/// A connector like [`connector`] whose transfers of a byte or more are
/// split over `streams` connections.
async fn striped_connector(streams: usize) -> Connector {
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

/// The active side's next frame, which must be an `Open`.
async fn expect_open(r: &mut Raw) -> Open {
    match r.next().await {
        Some((Message::Open(o), _)) => o,
        other => panic!("expected an open, got {other:?}"),
    }
}

/// Accepts a connection from the active side and answers its hello as the
/// fake passive worker (a further stream of a striped transfer, say).
async fn accept_hello(l: &tokio::net::TcpListener) -> Raw {
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
async fn active_side_still_works(active: &Connector) {
    let other = connector().await;
    let w = other
        .create_writable(vec![vec![0u8; 1000].into()])
        .await
        .unwrap();
    let op = active
        .begin_write(vec![pattern(1000, 4).into()], w.metadata())
        .await
        .unwrap();
    within(op.wait_for_completion()).await.unwrap();
    within(w.wait_for_completion()).await.unwrap();
    legit_transfers_still_work(active).await;
}

async fn hostile_reply_to_a_read(reply: impl FnOnce(u64) -> Vec<u8>, landed: usize) {
    let reader = connector().await;
    let (l, meta) = fake_passive(OperationKind::Read, &[32, 16]).await;
    let (op, (mut raw, open)) = tokio::join!(
        reader.begin_read(&meta, vec![untouched(32), untouched(16)]),
        accept_active(&l, FAKE_WORKER)
    );
    let op = op.unwrap();
    let req = open.unwrap().req;
    let _ = raw.send_raw(&reply(req)).await;
    let _ = raw.closed().await;
    let err = within(op.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::Protocol { .. }), "{err}");
    assert_eq!(op.status(), OperationStatus::Errored);
    let got = op.into_descriptors();
    let s = got[0].as_slice().unwrap();
    assert!(s[..landed].iter().all(|&b| b == 1), "{s:?}");
    assert!(s[landed..].iter().all(|&b| b == UNTOUCHED), "{s:?}");
    assert_all(&got[1], UNTOUCHED, "descriptor 1");
    active_side_still_works(&reader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_data_past_the_end_of_a_read_is_refused() {
    hostile_reply_to_a_read(|req| data_frame(req, 0, 0, &[1u8; 33]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_data_with_overflowing_offset_is_refused() {
    hostile_reply_to_a_read(|req| data_frame(req, 0, u64::MAX - 3, &[1u8; 8]), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_data_with_a_gap_is_refused() {
    hostile_reply_to_a_read(
        |req| {
            let mut f = data_frame(req, 0, 0, &[1u8; 8]);
            f.extend(data_frame(req, 1, 0, &[1u8; 8]));
            f
        },
        8,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_finish_before_all_data_is_refused() {
    hostile_reply_to_a_read(
        |req| {
            let mut f = data_frame(req, 0, 0, &[1u8; 32]);
            f.extend(Message::Finish { req }.to_vec());
            f
        },
        32,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_open_sent_to_the_active_side_is_refused() {
    hostile_reply_to_a_read(
        |req| {
            Message::Open(Open {
                req,
                op_id: 1,
                token: Token::from_bytes([7; 16]),
                kind: OperationKind::Write,
                sizes: vec![32, 16],
                pull: false,
                part: 0,
                parts: 1,
            })
            .to_vec()
        },
        0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_data_into_a_write_is_refused() {
    let writer = connector().await;
    let (l, meta) = fake_passive(OperationKind::Write, &[32]).await;
    let (op, (mut raw, open)) = tokio::join!(
        writer.begin_write(vec![pattern(32, 1).into()], &meta),
        accept_active(&l, FAKE_WORKER)
    );
    let op = op.unwrap();
    let req = open.unwrap().req;
    let _ = raw.send_raw(&data_frame(req, 0, 0, &[1u8; 32])).await;
    for m in raw.closed().await {
        assert!(
            matches!(m, Message::Data(_) | Message::Finish { .. }),
            "{m:?}"
        );
    }
    let err = within(op.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::Protocol { .. }), "{err}");
    assert_eq!(
        op.into_descriptors()[0].as_slice().unwrap(),
        &pattern(32, 1)[..],
        "a write's source is never written"
    );
    active_side_still_works(&writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_answering_as_another_worker_is_refused() {
    let reader = connector().await;
    let (l, meta) = fake_passive(OperationKind::Read, &[32]).await;
    let (op, _raw) = tokio::join!(
        reader.begin_read(&meta, vec![untouched(32)]),
        accept_active(&l, "someone-else")
    );
    let err = op.unwrap_err();
    assert!(
        matches!(err, Error::WrongWorker { ref found, .. } if found == "someone-else"),
        "{err}"
    );
    active_side_still_works(&reader).await;
}

/// The WRITE-side twin of `read_confirmation_before_all_data_is_refused`:
/// the passive side confirms a write before the writer has sent its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_passive_write_confirmation_before_all_data_is_refused() {
    let writer = connector().await;
    let (l, meta) = fake_passive(OperationKind::Write, &[8 << 20]).await;
    let (op, (mut raw, open)) = tokio::join!(
        writer.begin_write(vec![vec![0x11u8; 8 << 20].into()], &meta),
        accept_active(&l, FAKE_WORKER)
    );
    let op = op.unwrap();
    let req = open.unwrap().req;
    // Confirm at once, having read at most the first chunk of 8 MiB.
    raw.send(&Message::Finish { req }).await;
    let outcome = within(op.wait_for_completion()).await;
    assert!(
        matches!(outcome, Err(Error::Protocol { .. })),
        "the write ended with {outcome:?} ({})",
        op.status()
    );
    drop(raw);
    active_side_still_works(&writer).await;
}

/// A connector that may use cross-memory attach.
async fn attaching_connector() -> Connector {
    watch_panics();
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Cma, TransportKind::Tcp])
        .build()
        .await
        .expect("connector starts")
}

fn attach(pid: u32, addr: u64, cookie: [u8; 16], verdict: Verdict) -> Message {
    Message::Attach(Attach {
        pid,
        addr,
        cookie,
        verdict,
    })
}

async fn expect_attach(r: &mut Raw) -> Attach {
    match r.next().await {
        Some((Message::Attach(a), _)) => a,
        other => panic!("expected an attach frame, got {other:?}"),
    }
}

/// The attack the probe must stop: learn the connector's cookie on one
/// connection, replay it on another as if it were ours, so that the connector
/// "verifies" itself as our process and copies from addresses we choose.
/// The cookie is bound to its connection, so the replay is refused, and a
/// lease from a peer that did not pass the probe closes the connection
/// without a byte copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_attach_cookie_is_refused_and_its_lease_copies_nothing() {
    let target = attaching_connector().await;
    let secret = [0x5Au8; 64];
    let w = target.create_writable(vec![untouched(64)]).await.unwrap();
    let m = w.metadata().clone();

    let mut first = Raw::connect(&target).await;
    first
        .send(&attach(std::process::id(), 0, [1; 16], Verdict::Unknown))
        .await;
    let offered = expect_attach(&mut first).await;
    assert_ne!(offered.pid, 0, "the connector offers attach on loopback");

    let mut second = Raw::connect(&target).await;
    second
        .send(&attach(std::process::id(), 0, [2; 16], Verdict::Unknown))
        .await;
    let _ = expect_attach(&mut second).await;
    // Replay the connector's own cookie from the first connection.
    second
        .send(&attach(
            offered.pid,
            offered.addr,
            [0; 16],
            Verdict::CanPull,
        ))
        .await;
    let verdict = expect_attach(&mut second).await;
    assert_eq!(verdict.verdict, Verdict::Refused, "{verdict:?}");

    // Now ask it to copy `secret` (this process's memory) into the writable.
    let mut open = open_frame(7, &m, OperationKind::Write);
    if let Message::Open(o) = &mut open {
        o.pull = true;
    }
    second.send(&open).await;
    second
        .send(&Message::Lease(Lease {
            req: 7,
            segments: vec![(secret.as_ptr() as u64, 64)],
        }))
        .await;
    let got = second.closed().await;
    assert!(
        got.iter().all(|m| !matches!(m, Message::Finish { .. })),
        "{got:?}"
    );
    within(async {
        while !w.status().is_terminal() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert_eq!(w.status(), OperationStatus::Errored);
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "exposed buffer");
    drop(first);
    assert_no_library_panic();
}

/// Leases nobody asked for, and attach frames out of turn, close the
/// connection at once (no reply queue grows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unasked_leases_and_attach_out_of_turn_close_the_connection() {
    let target = attaching_connector().await;
    let mut r = Raw::connect(&target).await;
    let mut flood = Vec::new();
    for req in 0..10_000u64 {
        Message::Lease(Lease {
            req,
            segments: vec![(4096, 16)],
        })
        .encode(&mut flood);
    }
    let _ = r.send_raw(&flood).await;
    r.expect_closed().await;

    let mut r = Raw::connect(&target).await;
    r.send(&attach(1, 4096, [0; 16], Verdict::CanPull)).await;
    r.expect_closed().await;
    assert_no_library_panic();
}

fn expected_cookie(na: &[u8; 16], np: &[u8; 16], act: SocketAddr, pas: SocketAddr) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"ferry-cma-cookie-v1\0");
    h.update([1u8]); // the active side's cookie
    h.update(na);
    h.update(np);
    h.update(act.to_string().as_bytes());
    h.update([0u8]);
    h.update(pas.to_string().as_bytes());
    let mut o = [0u8; 16];
    o.copy_from_slice(&h.finalize()[..16]);
    o
}

/// The second attack on the probe: the attacker computes the cookie the
/// connector expects and gets it into the memory of a process that is not
/// the attacker — the connector's own (a `Data` payload for no request
/// passes through its read buffer: the reviewer's proof of concept hit that
/// by guessing addresses) — then names that process's pid and address. Here
/// the planting is made certain: the test process, which runs the
/// connector, puts the bytes at an address it tells the attacker. The bytes
/// are right, the permission is there, but the kernel says the connector's
/// process does not hold the attacker's socket: refused. (Without that
/// check this test gets `CanPull`.) The attacker is another process (this
/// test binary, run again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_planted_in_another_process_does_not_pass_the_probe() {
    use std::io::{BufRead, Write};
    const NAME: &str = "a_cookie_planted_in_another_process_does_not_pass_the_probe";
    if let Ok(addr) = std::env::var("FERRY_TEST_ATTACK") {
        return plant_cookie(addr.parse().unwrap()).await;
    }
    let target = attaching_connector().await;
    let addr = target.local_addr().to_string();
    let verdict = tokio::task::spawn_blocking(move || {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env("FERRY_TEST_ATTACK", addr)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut stdin = child.stdin.take().unwrap();
        let mut planted: Option<Box<[u8; 16]>> = None;
        let mut verdict = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            // The test harness may print "test NAME ... " first on the line.
            if let Some((_, hex)) = line.split_once("PLANT ") {
                let mut b = [0u8; 16];
                for (i, x) in b.iter_mut().enumerate() {
                    *x = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).unwrap();
                }
                let bx = Box::new(b);
                writeln!(stdin, "{}", bx.as_ptr() as u64).unwrap();
                stdin.flush().unwrap();
                planted = Some(bx);
            } else if let Some((_, v)) = line.split_once("VERDICT ") {
                verdict = v.to_string();
                break;
            }
        }
        assert!(
            child.wait().unwrap().success(),
            "the attacker process failed"
        );
        drop(planted);
        verdict
    })
    .await
    .unwrap();
    assert_eq!(verdict, "Refused");
    assert_no_library_panic();
}

/// The attacker's side.
async fn plant_cookie(target: SocketAddr) {
    let mut r = Raw::connect_bare(target).await;
    r.send(&Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "attacker".into(),
    }))
    .await;
    assert!(matches!(r.next().await, Some((Message::Hello(_), _))));
    let (act, pas) = (r.s.local_addr().unwrap(), r.s.peer_addr().unwrap());
    let na = [7u8; 16];
    r.send(&attach(1, 0, na, Verdict::Unknown)).await;
    let offered = expect_attach(&mut r).await;
    assert_ne!(offered.pid, std::process::id());
    let planted = expected_cookie(&na, &offered.cookie, act, pas);
    let hex: String = planted.iter().map(|b| format!("{b:02x}")).collect();
    println!("PLANT {hex}");
    let at: u64 = tokio::task::spawn_blocking(|| {
        let mut l = String::new();
        std::io::stdin().read_line(&mut l).unwrap();
        l.trim().parse().unwrap()
    })
    .await
    .unwrap();
    r.send(&attach(offered.pid, at, [0; 16], Verdict::CanPull))
        .await;
    let v = expect_attach(&mut r).await;
    println!("VERDICT {:?}", v.verdict);
}

// ---------------------------------------------------------------------------
// Striped transfers: the parts of one operation on several connections.

/// A WRITE of 10 bytes in two parts ([0, 5) and [5, 10)) on two connections:
/// each part lands in its range only, the second is confirmed on its own
/// connection, and the commit on the first completes the whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn striped_parts_land_in_their_ranges_and_commit_on_the_first() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    b.send(&part_open(7, &m, OperationKind::Write, 1, 2)).await;
    b.send_raw(&data_frame(7, 0, 5, &[2u8; 5])).await.unwrap();
    b.send(&Message::Finish { req: 7 }).await;
    match b.next().await {
        Some((Message::Finish { req: 7 }, _)) => {}
        other => panic!("expected part 1 to be confirmed, got {other:?}"),
    }
    assert_eq!(w.status(), OperationStatus::InProgress);
    a.send_raw(&data_frame(1, 0, 0, &[1u8; 5])).await.unwrap();
    a.send(&Message::Finish { req: 1 }).await;
    match a.next().await {
        Some((Message::Finish { req: 1 }, _)) => {}
        other => panic!("expected the write to be confirmed, got {other:?}"),
    }
    within(w.wait_for_completion()).await.unwrap();
    assert_eq!(
        w.into_descriptors()[0].as_slice().unwrap(),
        &[1, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    );
    assert_eq!(target.pending_count(), 0);
    legit_transfers_still_work(&target).await;
}

/// Bytes of another part's range, and a commit before every other part is
/// confirmed, break the protocol: the connection closes, the operation
/// fails, and bytes outside the part's range are never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_writing_outside_its_range_or_committing_early_is_refused() {
    for early_commit in [false, true] {
        let target = connector().await;
        let w = target.create_writable(vec![untouched(10)]).await.unwrap();
        let m = w.metadata().clone();
        let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
        a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
        b.send(&part_open(1, &m, OperationKind::Write, 1, 2)).await;
        b.barrier(2).await;
        if early_commit {
            a.send_raw(&data_frame(1, 0, 0, &[1u8; 5])).await.unwrap();
            let _ = a.send_raw(&Message::Finish { req: 1 }.to_vec()).await;
        } else {
            // Part 0 writes into part 1's range.
            let _ = a.send_raw(&data_frame(1, 0, 5, &[1u8; 5])).await;
        }
        // Closed, after at most the abort of the request that broke it.
        let got = a.closed().await;
        assert!(
            got.iter()
                .all(|m| matches!(m, Message::Abort(x) if x.req == 1)),
            "{got:?}"
        );
        expect_errored_protocol(&w).await;
        let d = w.into_descriptors();
        assert_all(
            &d[0].as_slice().unwrap()[5..].to_vec().into(),
            UNTOUCHED,
            "part 1's range",
        );
        // The other part's request ended with the operation.
        match b.next().await {
            Some((Message::Abort(x), _)) => {
                assert_eq!((x.req, x.reason), (1, AbortReason::PartFailed), "{x:?}")
            }
            other => panic!("expected part 1 to be aborted, got {other:?}"),
        }
        assert_eq!(target.pending_count(), 0);
        legit_transfers_still_work(&target).await;
    }
}

/// A part may be bound once, by the worker that bound the others, with the
/// same number of parts; anything else is `Busy` and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_bound_twice_or_by_another_worker_is_busy() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let mut a = Raw::connect(&target).await;
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    a.barrier(2).await;
    let mut b = Raw::connect(&target).await;
    b.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    b.expect_abort(1, AbortReason::Busy).await;
    b.send(&part_open(2, &m, OperationKind::Write, 1, 3)).await;
    b.expect_abort(2, AbortReason::Busy).await;
    b.send(&open_frame(3, &m, OperationKind::Write)).await;
    b.expect_abort(3, AbortReason::Busy).await;
    let mut other = Raw::connect_as(&target, "another-worker").await;
    other
        .send(&part_open(1, &m, OperationKind::Write, 1, 2))
        .await;
    other.expect_abort(1, AbortReason::Busy).await;
    // The rightful sender completes it.
    b.send(&part_open(4, &m, OperationKind::Write, 1, 2)).await;
    b.send_raw(&data_frame(4, 0, 5, &[2u8; 5])).await.unwrap();
    b.send(&Message::Finish { req: 4 }).await;
    assert!(matches!(
        b.next().await,
        Some((Message::Finish { req: 4 }, _))
    ));
    a.send_raw(&data_frame(1, 0, 0, &[1u8; 5])).await.unwrap();
    a.send(&Message::Finish { req: 1 }).await;
    assert!(matches!(
        a.next().await,
        Some((Message::Finish { req: 1 }, _))
    ));
    within(w.wait_for_completion()).await.unwrap();
    assert_eq!(
        w.into_descriptors()[0].as_slice().unwrap(),
        &[1, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    );
    legit_transfers_still_work(&target).await;
}

/// When one stream of a striped transfer is lost, the operation fails and
/// the requests of the other parts are ended and told (`PartFailed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_stream_fails_the_transfer_and_aborts_the_other_parts() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    b.send(&part_open(1, &m, OperationKind::Write, 1, 2)).await;
    b.send_raw(&data_frame(1, 0, 5, &[2u8; 3])).await.unwrap();
    b.barrier(2).await;
    drop(b);
    let err = within(w.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    let detail = a.expect_abort(1, AbortReason::PartFailed).await;
    assert!(detail.contains("connection"), "{detail}");
    assert_eq!(target.pending_count(), 0);
    assert_eq!(target.exposed_count(), 0);
    legit_transfers_still_work(&target).await;
}

/// The active side: when the passive side drops one stream of a striped
/// READ, the READ fails, and the other part is aborted on its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_read_fails_when_the_passive_drops_one_stream() {
    let reader = striped_connector(2).await;
    let (l, meta) = fake_passive(OperationKind::Read, &[64]).await;
    // The reader connects both streams before it sends either `Open`.
    let hello = || accept_hello(&l);
    let (op, (mut first, mut second)) =
        tokio::join!(reader.begin_read(&meta, vec![untouched(64)]), async {
            (hello().await, hello().await)
        });
    let op = op.unwrap();
    let (open0, open1) = (
        expect_open(&mut first).await,
        expect_open(&mut second).await,
    );
    assert_eq!(
        (open0.part, open0.parts, open1.part, open1.parts),
        (0, 2, 1, 2)
    );
    // Half of part 1, then the stream is gone.
    second
        .send_raw(&data_frame(open1.req, 0, 32, &[5u8; 16]))
        .await
        .unwrap();
    drop(second);
    let err = within(op.wait_for_completion()).await.unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    let detail = first.expect_abort(open0.req, AbortReason::PartFailed).await;
    assert!(detail.contains("connection"), "{detail}");
    assert_eq!(reader.pending_count(), 0);
    let _ = op.into_descriptors();
    active_side_still_works(&reader).await;
}

/// A part that has landed and been confirmed still belongs to the
/// operation until it ends: an `Abort` on it, or its connection lost, ends
/// the operation (it would otherwise stay in progress, exposed, forever,
/// since part 0 never arrives); a replayed `Finish` changes nothing, and
/// its request number stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_part_still_carries_an_abort_or_a_lost_connection() {
    for abort in [true, false] {
        let target = connector().await;
        let w = target.create_writable(vec![untouched(10)]).await.unwrap();
        let m = w.metadata().clone();
        let mut b = Raw::connect(&target).await;
        b.send(&part_open(1, &m, OperationKind::Write, 1, 2)).await;
        b.send_raw(&data_frame(1, 0, 5, &[2u8; 5])).await.unwrap();
        b.send(&Message::Finish { req: 1 }).await;
        assert!(matches!(
            b.next().await,
            Some((Message::Finish { req: 1 }, _))
        ));
        b.send(&Message::Finish { req: 1 }).await;
        b.barrier(2).await;
        assert_eq!(w.status(), OperationStatus::InProgress);
        if abort {
            b.send(&Message::Abort(Abort {
                req: 1,
                reason: AbortReason::PartFailed,
                detail: "the other stream died".into(),
            }))
            .await;
        } else {
            drop(b);
        }
        let err = within(w.wait_for_completion()).await.unwrap_err();
        assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
        assert_eq!(w.status(), OperationStatus::Errored);
        assert_eq!(target.exposed_count(), 0);
        assert_eq!(target.pending_count(), 0);
        legit_transfers_still_work(&target).await;
    }
    // The request number of a confirmed part stays taken.
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let mut b = Raw::connect(&target).await;
    b.send(&part_open(1, w.metadata(), OperationKind::Write, 1, 2))
        .await;
    b.send_raw(&data_frame(1, 0, 5, &[2u8; 5])).await.unwrap();
    b.send(&Message::Finish { req: 1 }).await;
    assert!(matches!(
        b.next().await,
        Some((Message::Finish { req: 1 }, _))
    ));
    b.send(&open_frame(1, w.metadata(), OperationKind::Write))
        .await;
    let got = b.closed().await;
    assert!(
        got.iter().all(|m| matches!(m, Message::Abort(_))),
        "{got:?}"
    );
    assert_eq!(w.status(), OperationStatus::Errored);
}

/// A hostile destination confirms a part of a striped WRITE before the
/// writer has sent all of it: the writer refuses that (the commit would
/// otherwise follow unsent bytes) and the WRITE fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_confirmed_before_it_was_sent_is_refused() {
    let writer = striped_connector(2).await;
    let (l, meta) = fake_passive(OperationKind::Write, &[32 << 20]).await;
    let hello = || accept_hello(&l);
    let (op, (_first, mut second)) = tokio::join!(
        writer.begin_write(vec![vec![0x22u8; 32 << 20].into()], &meta),
        async { (hello().await, hello().await) }
    );
    let op = op.unwrap();
    let open1 = expect_open(&mut second).await;
    assert_eq!((open1.part, open1.parts), (1, 2));
    // 16 MiB are on their way and this side reads none of them: confirm now.
    second.send(&Message::Finish { req: open1.req }).await;
    let outcome = within(op.wait_for_completion()).await;
    assert!(
        matches!(outcome, Err(Error::Protocol { .. })),
        "the write ended with {outcome:?}"
    );
    drop(second);
    active_side_still_works(&writer).await;
}

/// The parts of a striped transfer travel on independent connections, so a
/// part's `Open` may arrive after the owner cancelled: it is told what the
/// bound parts were told (`Cancelled`), not just "ended", so that the
/// remote reads a cancel whichever part it hears of first. A striped
/// operation cancelled before any part was bound is simply "ended".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_arriving_after_a_cancel_is_told_of_the_cancel() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
    b.send(&part_open(1, &m, OperationKind::Write, 1, 2)).await;
    b.barrier(2).await;
    w.cancel();
    b.expect_abort(1, AbortReason::Cancelled).await;
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    a.expect_abort(1, AbortReason::Cancelled).await;

    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    w.cancel();
    a.send(&part_open(2, &m, OperationKind::Write, 0, 2)).await;
    a.expect_abort(2, AbortReason::OperationEnded).await;
    legit_transfers_still_work(&target).await;
}

/// A part other than 0 of a striped WRITE that claims to be finished before
/// its bytes arrived is a violation that ends the operation (it once
/// deadlocked the reader: the violation took the table it still held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_finished_before_its_bytes_ends_the_operation() {
    let target = connector().await;
    let w = target.create_writable(vec![untouched(10)]).await.unwrap();
    let m = w.metadata().clone();
    let (mut a, mut b) = (Raw::connect(&target).await, Raw::connect(&target).await);
    a.send(&part_open(1, &m, OperationKind::Write, 0, 2)).await;
    b.send(&part_open(7, &m, OperationKind::Write, 1, 2)).await;
    b.send(&Message::Finish { req: 7 }).await;
    let detail = b.expect_abort(7, AbortReason::PartFailed).await;
    assert!(detail.contains("finish before all data"), "{detail}");
    b.expect_closed().await;
    let r = within(w.wait_for_completion()).await;
    assert!(r.is_err(), "{r:?}");
    assert_all(&w.into_descriptors()[0], UNTOUCHED, "the writable");
    legit_transfers_still_work(&target).await;
    assert_no_library_panic();
}
