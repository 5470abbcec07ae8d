//! What a peer that holds no valid token can make a listener spend: for
//! every frame type, as a connection's first frame, in place of the
//! handshake's authentication frame, after the hello of a listener without
//! a secret, and inside the secure channel of a listener whose secret the
//! peer holds (but no token), the victim's memory and CPU follow the bytes
//! the peer sent.
//!
//! The bound (also in `docs/security.md`, "What the listener accepts from
//! an unknown connection"), per connection:
//!
//! - memory: the victim allocates at most [`K_BYTES`] + [`C_BYTES`] bytes
//!   per byte received (counted by this binary's global allocator on every
//!   thread but the attacker's: cumulative, so it bounds the peak too);
//! - CPU: the victim's threads use at most [`K_CPU`] + [`C_CPU`] per byte
//!   received (`getrusage`: the process less the attacker's thread;
//!   generous, so that a loaded machine does not fail it).
//!
//! Each frame is the most expensive of its type that a peer can send: an
//! `Open` of one run of 2^20 blocks (62 bytes), a `Lease` whose lengths and
//! addresses are one run each (54 bytes), the longest detail, handshake and
//! RDMA address, and so on. Each is followed by an `Open` that the victim
//! must refuse (so that the attacker knows the frame was handled), and sent
//! again, [`REPS`] times in all, while the victim keeps the connection open.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry::{Connector, Device, OperationKind, RdmaMetadata};
use ferry_proto::wire::{self, Abort, AbortReason, Auth, Data, Hello, LaneOffer, Message};
use ferry_proto::{DescriptorInfo, Token};

/// The victim's allowance per connection: its tables, its buffers, the
/// tasks of a connection, and with a secret the Noise handshake.
const K_BYTES: u64 = 64 * 1024;
/// And per byte received.
const C_BYTES: u64 = 16;
/// CPU per connection.
const K_CPU: Duration = Duration::from_millis(20);
/// And per byte received.
const C_CPU: Duration = Duration::from_nanos(100);
/// How many times a frame goes out on a connection the victim keeps open.
const REPS: usize = 32;

// ---------------------------------------------------------------------------
// Counting what the victim allocates.

struct Counting;

/// Bytes obtained from the allocator by every thread but the attacker's.
static VICTIM_BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread is the attacker's: its allocations are not the victim's.
    static ATTACKER: Cell<bool> = const { Cell::new(false) };
}

fn count(n: usize) {
    if !ATTACKER.try_with(Cell::get).unwrap_or(false) {
        VICTIM_BYTES.fetch_add(n as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call goes to the system allocator with the caller's
// arguments unchanged; counting touches no allocated memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size());
        // SAFETY: as the caller promised for `l`.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count(l.size());
        // SAFETY: as the caller promised for `l`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new.saturating_sub(l.size()));
        // SAFETY: as the caller promised for `p`, `l` and `new`.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as the caller promised for `p` and `l`.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn cpu(who: libc::c_int) -> Duration {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value it is
    // given; nothing else is touched.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(who, &mut ru), 0);
        ru
    };
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// CPU time of every thread but this one (the attacker's).
fn victim_cpu() -> Duration {
    cpu(libc::RUSAGE_SELF).saturating_sub(cpu(libc::RUSAGE_THREAD))
}

// ---------------------------------------------------------------------------
// The attacker's frames, written byte by byte where the encoder of this
// build would not make them.

fn header(ty: u8, body: &[u8]) -> Vec<u8> {
    let mut f = vec![ty, 0, 0, 0];
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// An `Open` of `op_id` with a token that is not its own, for sizes given
/// as runs.
fn open(req: u64, op_id: u64, runs: &[(u64, u32)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&req.to_le_bytes());
    b.extend_from_slice(&op_id.to_le_bytes());
    b.extend_from_slice(&[0x5a; 16]); // token
    b.push(2); // WRITE
    b.push(0); // not pulled
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    for &(size, n) in runs {
        b.extend_from_slice(&size.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
    }
    header(2, &b)
}

/// A `Lease` of 2^20 segments: lengths as one run, addresses as one run
/// (`each`: instead `n` lengths of 8 and one address each).
fn lease(each: Option<u32>) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&7u64.to_le_bytes());
    b.push(1); // the lane
    b.extend_from_slice(&0u32.to_le_bytes()); // no key
    b.extend_from_slice(&1u32.to_le_bytes());
    match each {
        None => {
            b.extend_from_slice(&4096u64.to_le_bytes());
            b.extend_from_slice(&(1u32 << 20).to_le_bytes());
            b.push(1);
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(&0x1000u64.to_le_bytes());
            b.extend_from_slice(&(1u32 << 20).to_le_bytes());
        }
        Some(n) => {
            b.extend_from_slice(&8u64.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
            b.push(0);
            for i in 0..u64::from(n) {
                b.extend_from_slice(&(0x1000 + 64 * i).to_le_bytes());
            }
        }
    }
    header(7, &b)
}

/// The most expensive frame of each type, by name.
fn frames(op_id: u64) -> Vec<(&'static str, Vec<u8>)> {
    let all_runs: Vec<(u64, u32)> = (0..16_384u64).map(|i| (1 + i % 2, 64)).collect();
    vec![
        (
            "hello",
            Message::Hello(Hello {
                version: wire::PROTOCOL_VERSION,
                worker_id: "h".repeat(256),
            })
            .to_vec(),
        ),
        ("open: one run of 2^20", open(9, op_id, &[(4096, 1 << 20)])),
        ("open: 16,384 runs", open(9, op_id, &all_runs)),
        ("data: 4 KiB", {
            let mut f = Message::Data(Data {
                req: 7,
                desc: 0,
                offset: 0,
                len: 4096,
            })
            .to_vec();
            f.extend_from_slice(&[0u8; 4096]);
            f
        }),
        ("finish", Message::Finish { req: 7 }.to_vec()),
        (
            "abort",
            Message::Abort(Abort {
                req: 7,
                reason: AbortReason::Cancelled,
                detail: "d".repeat(1024),
            })
            .to_vec(),
        ),
        (
            "auth",
            Message::Auth(Auth {
                handshake: vec![3; 1024],
            })
            .to_vec(),
        ),
        ("lease: runs of 2^20", lease(None)),
        ("lease: 4,096 addresses", lease(Some(4096))),
        (
            "lane offer: cma",
            Message::LaneOffer(LaneOffer {
                lane: ferry_proto::lane::LaneId::CMA,
                round: 0,
                bytes: vec![1; 30],
            })
            .to_vec(),
        ),
        ("release", Message::Release { req: 7 }.to_vec()),
        (
            "lane offer: the longest",
            Message::LaneOffer(LaneOffer {
                lane: ferry_proto::lane::LaneId::UCX,
                round: 0,
                bytes: vec![5; wire::MAX_LANE_OFFER],
            })
            .to_vec(),
        ),
    ]
}

// ---------------------------------------------------------------------------
// The attacker's side of a connection, in plaintext or through the secure
// channel (a Noise handshake it can complete: it holds the secret).

const SECRET: &str = "a deployment secret of some length";
const PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";

struct Peer {
    s: TcpStream,
    noise: Option<snow::TransportState>,
    /// Plaintext received, not yet decoded.
    got: Vec<u8>,
    sent: u64,
}

impl Peer {
    fn connect(addr: SocketAddr) -> Peer {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Peer {
            s,
            noise: None,
            got: Vec::new(),
            sent: 0,
        }
    }

    fn hello() -> Vec<u8> {
        Message::Hello(Hello {
            version: wire::PROTOCOL_VERSION,
            worker_id: "intruder".into(),
        })
        .to_vec()
    }

    /// Sends its hello and, with the secret, runs the handshake.
    fn handshake(&mut self, secret: bool) {
        let hello = Self::hello();
        if !secret {
            self.send(&hello);
            return;
        }
        let mut psk = [0u8; 32];
        hkdf::Hkdf::<sha2::Sha256>::new(Some(b"ferry shared secret v1"), SECRET.as_bytes())
            .expand(PATTERN.as_bytes(), &mut psk)
            .unwrap();
        let prologue = [&b"ferry secure channel v1\0"[..], &hello].concat();
        let mut hs = snow::Builder::new(PATTERN.parse().unwrap())
            .psk(0, &psk)
            .prologue(&prologue)
            .build_initiator()
            .unwrap();
        let mut m = vec![0u8; 1024];
        let n = hs.write_message(&[], &mut m).unwrap();
        let mut first = hello;
        Message::Auth(Auth {
            handshake: m[..n].to_vec(),
        })
        .encode(&mut first);
        self.send(&first);
        assert!(matches!(self.next(), Some(Message::Hello(_))));
        let Some(Message::Auth(a)) = self.next() else {
            panic!("no auth answer")
        };
        let mut payload = vec![0u8; 1024];
        hs.read_message(&a.handshake, &mut payload).unwrap();
        self.noise = Some(hs.into_transport_mode().unwrap());
        // Bytes after the handshake are ciphertext: none came yet (the
        // victim waits for the attacker).
        assert!(self.got.is_empty());
    }

    fn send(&mut self, plain: &[u8]) -> bool {
        self.sent += plain.len() as u64;
        let bytes = match &mut self.noise {
            None => plain.to_vec(),
            Some(t) => {
                let mut out = Vec::new();
                let mut ct = vec![0u8; 65535];
                for chunk in plain.chunks(65535 - 16) {
                    let n = t.write_message(chunk, &mut ct).unwrap();
                    out.extend_from_slice(&(n as u16).to_be_bytes());
                    out.extend_from_slice(&ct[..n]);
                }
                out
            }
        };
        self.s.write_all(&bytes).is_ok()
    }

    /// Reads more of the stream: false at its end.
    fn receive(&mut self) -> bool {
        match &mut self.noise {
            None => {
                let mut b = [0u8; 4096];
                match self.s.read(&mut b) {
                    Ok(0) | Err(_) => false,
                    Ok(n) => {
                        self.got.extend_from_slice(&b[..n]);
                        true
                    }
                }
            }
            Some(t) => {
                let mut len = [0u8; 2];
                if self.s.read_exact(&mut len).is_err() {
                    return false;
                }
                let mut ct = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if self.s.read_exact(&mut ct).is_err() {
                    return false;
                }
                let mut plain = vec![0u8; ct.len()];
                let n = t.read_message(&ct, &mut plain).unwrap();
                self.got.extend_from_slice(&plain[..n]);
                true
            }
        }
    }

    /// The next frame from the victim; `None` once it closed.
    fn next(&mut self) -> Option<Message> {
        loop {
            if let Ok(Some((m, used))) = wire::decode_frame(&self.got) {
                self.got.drain(..used);
                return Some(m);
            }
            if !self.receive() {
                return None;
            }
        }
    }

    /// Waits for the victim's refusal of request `req`: false if it closed
    /// the connection instead.
    fn refused(&mut self, req: u64) -> bool {
        while let Some(m) = self.next() {
            if matches!(m, Message::Abort(a) if a.req == req) {
                return true;
            }
        }
        false
    }
}

// ---------------------------------------------------------------------------
// The phases of a connection.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The frame instead of the hello.
    FirstFrame,
    /// A listener with a secret: the hello, then the frame instead of the
    /// authentication frame.
    InPlaceOfAuth,
    /// A listener without a secret: the hello, then the frame.
    AfterHello,
    /// A listener with a secret that the attacker holds: the handshake,
    /// then the frame through the secure channel.
    AfterAuth,
}

struct Cost {
    sent: u64,
    bytes: u64,
    cpu: Duration,
}

fn attack(addr: SocketAddr, phase: Phase, frame: &[u8], op_id: u64) -> Cost {
    // Whatever the victim is still doing for the connection before.
    std::thread::sleep(Duration::from_millis(30));
    let (bytes0, cpu0) = (VICTIM_BYTES.load(Ordering::Relaxed), victim_cpu());
    let mut p = Peer::connect(addr);
    match phase {
        Phase::FirstFrame => {}
        Phase::InPlaceOfAuth => {
            p.send(&Peer::hello());
        }
        Phase::AfterHello | Phase::AfterAuth => p.handshake(phase == Phase::AfterAuth),
    }
    for i in 0..REPS as u64 {
        // The frame, then an `Open` that the victim must refuse: the frame
        // was handled once that refusal comes back (or the connection
        // closes: the victim refused the frame).
        let sync = 1_000_000 + i;
        let mut f = frame.to_vec();
        f.extend_from_slice(&open(sync, op_id, &[(64, 1)]));
        if !p.send(&f) || !p.refused(sync) {
            break;
        }
    }
    let cost = Cost {
        sent: p.sent,
        bytes: VICTIM_BYTES.load(Ordering::Relaxed) - bytes0,
        cpu: victim_cpu().saturating_sub(cpu0),
    };
    drop(p);
    cost
}

#[test]
fn no_frame_costs_the_victim_more_than_a_constant_times_its_bytes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let build = |secret: bool| {
        rt.block_on(async {
            let mut b = Connector::builder().listen("127.0.0.1:0".parse().unwrap());
            if secret {
                b = b.secret(SECRET);
            }
            let c = b.build().await.unwrap();
            // A live operation: the attacker names it, without its token.
            let w = c.create_writable(vec![vec![0u8; 64].into()]).await.unwrap();
            let op_id = w.metadata().operation_id();
            (c, w, op_id)
        })
    };
    let (plain, _w1, op_plain) = build(false);
    let (secret, _w2, op_secret) = build(true);
    ATTACKER.with(|a| a.set(true));

    let mut failed = Vec::new();
    for phase in [
        Phase::FirstFrame,
        Phase::InPlaceOfAuth,
        Phase::AfterHello,
        Phase::AfterAuth,
    ] {
        let (addr, op_id) = match phase {
            Phase::FirstFrame | Phase::AfterHello => (plain.local_addr(), op_plain),
            Phase::InPlaceOfAuth | Phase::AfterAuth => (secret.local_addr(), op_secret),
        };
        for (name, frame) in frames(op_id) {
            let c = attack(addr, phase, &frame, op_id);
            let (max_bytes, max_cpu) = (K_BYTES + C_BYTES * c.sent, K_CPU + C_CPU * c.sent as u32);
            let ok = c.bytes <= max_bytes && c.cpu <= max_cpu;
            let line = format!(
                "{phase:?}, {name}: {} bytes sent; victim allocated {} bytes (bound {max_bytes}), \
                 used {:?} of CPU (bound {max_cpu:?})",
                c.sent, c.bytes, c.cpu
            );
            println!("{}{line}", if ok { "ok      " } else { "FAILED  " });
            if !ok {
                failed.push(line);
            }
        }
    }
    ATTACKER.with(|a| a.set(false));
    assert!(
        failed.is_empty(),
        "beyond the bound of {K_BYTES} bytes + {C_BYTES} per byte and {K_CPU:?} + {C_CPU:?} \
         per byte:\n{}",
        failed.join("\n")
    );
    rt.block_on(async move { drop((plain, secret, _w1, _w2)) });
}

/// The other direction: the connecting side (a READ's) against a hostile
/// passive side that answers its hello with a frame of each type, in
/// place of the authentication frame (the reader has a secret) or where
/// the session begins (it has none). The same bound.
#[test]
fn a_hostile_passive_side_costs_the_connecting_side_a_constant_times_its_bytes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let meta = RdmaMetadata::new(
        OperationKind::Read,
        "fake-passive".into(),
        "fake-host".into(),
        "fake-boot-id".into(),
        vec![l.local_addr().unwrap()],
        1,
        Token::from_bytes([7; 16]),
        vec![DescriptorInfo::new(Device::CPU, 64)],
    )
    .unwrap();
    ATTACKER.with(|a| a.set(true));
    let mut failed = Vec::new();
    for secret in [false, true] {
        let reader = rt.block_on(async {
            let mut b = Connector::builder();
            if secret {
                b = b.secret(SECRET);
            }
            std::sync::Arc::new(b.build().await.unwrap())
        });
        for (name, frame) in frames(1) {
            std::thread::sleep(Duration::from_millis(30));
            let (bytes0, cpu0) = (VICTIM_BYTES.load(Ordering::Relaxed), victim_cpu());
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let (c, m) = (reader.clone(), meta.clone());
            rt.spawn(async move {
                let r = match c.begin_read(&m, vec![vec![0u8; 64].into()]).await {
                    Ok(op) => op.wait_for_completion().await,
                    Err(e) => Err(e),
                };
                let _ = done_tx.send(r.is_err());
            });
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            // Its hello (and with a secret its handshake message).
            let mut b = [0u8; 4096];
            let _ = s.read(&mut b);
            let mut f = Message::Hello(Hello {
                version: wire::PROTOCOL_VERSION,
                worker_id: "fake-passive".into(),
            })
            .to_vec();
            f.extend_from_slice(&frame);
            // Then the refusal of its request (number 1, the first on the
            // connection), which ends the READ if nothing else did.
            Message::Abort(Abort {
                req: 1,
                reason: AbortReason::UnknownOperation,
                detail: String::new(),
            })
            .encode(&mut f);
            let sent = f.len() as u64;
            let _ = s.write_all(&f);
            let errored = done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
            assert!(errored, "{name}: the READ of a hostile passive side failed");
            let bytes = VICTIM_BYTES.load(Ordering::Relaxed) - bytes0;
            let cpu = victim_cpu().saturating_sub(cpu0);
            drop(s);
            let (max_bytes, max_cpu) = (K_BYTES + C_BYTES * sent, K_CPU + C_CPU * sent as u32);
            let ok = bytes <= max_bytes && cpu <= max_cpu;
            let line = format!(
                "reader (secret: {secret}), {name}: {sent} bytes sent; victim allocated {bytes} \
                 bytes (bound {max_bytes}), used {cpu:?} of CPU (bound {max_cpu:?})"
            );
            println!("{}{line}", if ok { "ok      " } else { "FAILED  " });
            if !ok {
                failed.push(line);
            }
        }
        rt.block_on(async move { drop(reader) });
    }
    ATTACKER.with(|a| a.set(false));
    assert!(
        failed.is_empty(),
        "beyond the bound:\n{}",
        failed.join("\n")
    );
}
