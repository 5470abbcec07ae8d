//! Liveness with a bound the user sets: a peer that is alive but stopped
//! (`SIGSTOP`) mid-transfer is detected on both sides, with a typed cause;
//! an idle connection with heartbeats configured costs nothing.
//!
//! Each test runs this test binary again as the peer (a real process, in
//! a role chosen by an environment variable), so that it can be stopped,
//! and so that its CPU time is its own.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ferry::{
    AbortReason, Connector, Descriptor, Error, OperationStatus, RdmaMetadata, TransportKind,
};

const ROLE: &str = "FERRY_TEST_LIVENESS_ROLE";
/// The bound these tests run with.
const BOUND: Duration = Duration::from_millis(1000);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn connector(bound: Duration) -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(1)
        .liveness(bound)
        .build()
        .await
        .expect("connector starts")
}

/// This test binary, run again for test `name` in `role`; killed when
/// dropped.
struct Peer(Child);

impl Peer {
    fn spawn(name: &str, role: &str) -> (Peer, BufReader<ChildStdout>) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env("FERRY_LIVENESS_MS", BOUND.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        (Peer(child), out)
    }

    fn signal(&self, sig: i32) {
        // SAFETY: a signal to our own child process, by its pid.
        let r = unsafe { libc::kill(self.0.id() as i32, sig) };
        assert_eq!(r, 0, "kill({sig})");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The rest of the next line of `out` after `tag`.
fn line_after(out: &mut BufReader<ChildStdout>, tag: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("the peer ended before it said {tag:?}");
        }
        if let Some((_, rest)) = line.split_once(tag) {
            return rest.trim().to_string();
        }
    }
}

fn say(tag: &str, rest: impl std::fmt::Display) {
    let mut o = std::io::stdout().lock();
    writeln!(o, "\n{tag} {rest}").unwrap();
    o.flush().unwrap();
}

/// The peer of the `SIGSTOP` test: exposes a writable, stops itself the
/// moment a transfer binds it (so that the transfer is surely mid-way),
/// and, once continued, reports how its operation ended.
fn stopped_writable() {
    runtime().block_on(async {
        let c = connector(BOUND).await;
        let w = c
            .create_writable(vec![Descriptor::from_vec(vec![0u8; 64 << 20])])
            .await
            .unwrap();
        say("META", w.metadata().to_json());
        while w.status() == OperationStatus::Initialized {
            std::thread::sleep(Duration::from_micros(100));
        }
        say("STOPPING", "");
        // SAFETY: stops this process; the test continues it.
        unsafe { libc::raise(libc::SIGSTOP) };
        let resumed = Instant::now();
        let r = w.wait_for_completion_timeout(Duration::from_secs(10)).await;
        say(
            "ENDED",
            format!("{} {:?} | {r:?}", resumed.elapsed().as_millis(), w.status()),
        );
    });
}

#[test]
fn a_peer_stopped_mid_transfer_is_detected_within_the_bound_on_both_sides() {
    if std::env::var(ROLE).as_deref() == Ok("stopped") {
        return stopped_writable();
    }
    let name = "a_peer_stopped_mid_transfer_is_detected_within_the_bound_on_both_sides";
    let (peer, mut out) = Peer::spawn(name, "stopped");
    let meta = RdmaMetadata::from_json(&line_after(&mut out, "META")).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let c = connector(BOUND).await;
        let write = c
            .begin_write(vec![Descriptor::from_vec(vec![7u8; 64 << 20])], &meta)
            .await
            .unwrap();
        line_after(&mut out, "STOPPING");
        let stopped = Instant::now();
        let r = write
            .wait_for_completion_timeout(BOUND + Duration::from_secs(5))
            .await;
        let detected = stopped.elapsed();
        eprintln!("active side (alive): {:?} after the stop: {r:?}", detected);
        match r {
            Err(Error::PeerUnresponsive { after, .. }) => assert!(after >= BOUND, "{after:?}"),
            other => panic!("expected PeerUnresponsive, got {other:?}"),
        }
        assert_eq!(write.status(), OperationStatus::Errored);
        assert!(
            detected >= BOUND / 2 && detected < BOUND + Duration::from_secs(2),
            "detected after {detected:?} with a bound of {BOUND:?}"
        );
        assert!(c.metrics().connections.unresponsive >= 1);
    });
    // The stopped side, continued, learns at once that its transfer ended.
    peer.signal(libc::SIGCONT);
    let ended = line_after(&mut out, "ENDED");
    eprintln!("passive side (stopped, then continued): {ended}");
    let (ms, rest) = ended.split_once(' ').unwrap();
    let ms: u64 = ms.parse().unwrap();
    assert!(rest.starts_with("Errored"), "{rest}");
    assert!(
        rest.contains("PeerUnresponsive") || rest.contains("ConnectionLost"),
        "{rest}"
    );
    assert!(
        ms < (BOUND + Duration::from_secs(2)).as_millis() as u64,
        "{ms} ms"
    );
}

/// User CPU plus system CPU of this process so far, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The fields after the command name (which may hold spaces), from
    // field 3 on: utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// The peer of the idle test: two connectors with an aggressive bound,
/// one transfer, then an idle connection watched for three seconds.
fn idle_pair() {
    runtime().block_on(async {
        let bound = Duration::from_millis(100);
        let a = connector(bound).await;
        let b = connector(bound).await;
        let r = a
            .create_readable(vec![Descriptor::from_vec(vec![1u8; 1 << 20])])
            .await
            .unwrap();
        let read = b
            .begin_read(r.metadata(), vec![Descriptor::from_vec(vec![0u8; 1 << 20])])
            .await
            .unwrap();
        read.wait_for_completion().await.unwrap();
        r.wait_for_completion().await.unwrap();
        // The timer armed during the transfer fires once more at most.
        tokio::time::sleep(bound).await;
        let count = || {
            let (x, y) = (a.metrics().connections, b.metrics().connections);
            (
                x.heartbeats + y.heartbeats,
                x.liveness_wakeups + y.liveness_wakeups,
            )
        };
        let before = count();
        let t0 = cpu_ticks();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let ticks = cpu_ticks() - t0;
        let after = count();
        assert!(
            a.connection_count() + b.connection_count() >= 1,
            "still connected"
        );
        say(
            "IDLE",
            format!("{ticks} {} {}", after.0 - before.0, after.1 - before.1),
        );
    });
}

#[test]
fn an_idle_connection_with_heartbeats_configured_sends_nothing_and_wakes_nothing() {
    if std::env::var(ROLE).as_deref() == Ok("idle") {
        return idle_pair();
    }
    let name = "an_idle_connection_with_heartbeats_configured_sends_nothing_and_wakes_nothing";
    let (_peer, mut out) = Peer::spawn(name, "idle");
    let idle = line_after(&mut out, "IDLE");
    let v: Vec<u64> = idle.split(' ').map(|x| x.parse().unwrap()).collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    eprintln!(
        "idle for 3 s with a 100 ms liveness bound: {} ms of CPU, {} heartbeats, {} liveness wake-ups",
        v[0] * 1000 / hz,
        v[1],
        v[2]
    );
    assert_eq!(v[1], 0, "no heartbeat on an idle connection");
    assert_eq!(v[2], 0, "no liveness wake-up on an idle connection");
    // Zero in practice; a tick or two of noise allowed.
    assert!(
        v[0] * 1000 / hz <= 30,
        "{} ms of CPU while idle",
        v[0] * 1000 / hz
    );
}

/// Connections kept busy, with a short bound, for ten bounds: a peer
/// that is alive (it sends, or answers heartbeats) is never declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_answers_is_never_declared() {
    let bound = Duration::from_millis(100);
    let a = connector(bound).await;
    let b = connector(bound).await;
    // Many transfers, back to back, for longer than ten bounds.
    let t = Instant::now();
    while t.elapsed() < bound * 10 {
        let r = a
            .create_readable(vec![Descriptor::from_vec(vec![1u8; 32 << 20])])
            .await
            .unwrap();
        let read = b
            .begin_read(
                r.metadata(),
                vec![Descriptor::from_vec(vec![0u8; 32 << 20])],
            )
            .await
            .unwrap();
        read.wait_for_completion().await.unwrap();
        r.wait_for_completion().await.unwrap();
    }
    assert_eq!(a.metrics().connections.unresponsive, 0);
    assert_eq!(b.metrics().connections.unresponsive, 0);
}

#[test]
fn the_abort_reasons_have_their_codes() {
    assert_eq!(AbortReason::PeerUnresponsive.code(), 15);
    assert_eq!(AbortReason::Expired.code(), 16);
    assert_eq!(AbortReason::from_code(15), AbortReason::PeerUnresponsive);
    assert_eq!(AbortReason::from_code(16), AbortReason::Expired);
}

/// A cross-memory copy that lasts several bounds (its lane copies on a
/// blocking thread, the runtime answers the heartbeats meanwhile) is not
/// taken for a dead peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_cross_memory_copy_is_not_taken_for_a_dead_peer() {
    let bound = Duration::from_millis(40);
    let cma = || {
        Connector::builder()
            .listen("127.0.0.1:0".parse().unwrap())
            .transports(&[TransportKind::Cma, TransportKind::Tcp])
            .cma_threshold(0)
            .liveness(bound)
            .build()
    };
    let (a, b) = (cma().await.unwrap(), cma().await.unwrap());
    let size = 256usize << 20;
    let r = a
        .create_readable(vec![Descriptor::from_vec(vec![1u8; size])])
        .await
        .unwrap();
    let t = Instant::now();
    let read = b
        .begin_read(r.metadata(), vec![Descriptor::from_vec(vec![0u8; size])])
        .await
        .unwrap();
    read.wait_for_completion().await.unwrap();
    r.wait_for_completion().await.unwrap();
    let took = t.elapsed();
    let (x, y) = (a.metrics().connections, b.metrics().connections);
    eprintln!(
        "a copy of 256 MiB by {:?} took {took:?} with a {bound:?} bound: {} heartbeats",
        read.transport(),
        x.heartbeats + y.heartbeats
    );
    assert_eq!(x.unresponsive + y.unresponsive, 0);
}

/// A hand-made peer that opens a READ, takes its bytes and then neither
/// confirms nor answers a heartbeat: the connector declares it within the
/// bound, tells it why on the wire (`PeerUnresponsive`, code 15) and ends
/// its readable with `Error::PeerUnresponsive`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_hears_why_its_request_ends() {
    use ferry_proto::wire::{self, Hello, Message, Open, PROTOCOL_VERSION};
    use ferry_proto::OperationKind;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let bound = Duration::from_millis(300);
    let c = connector(bound).await;
    let r = c
        .create_readable(vec![Descriptor::from_vec(vec![4u8; 4096])])
        .await
        .unwrap();
    let m = r.metadata().clone();
    let mut s = tokio::net::TcpStream::connect(c.local_addr())
        .await
        .unwrap();
    let mut frames = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "silent".into(),
    })
    .to_vec();
    Message::Open(Open {
        req: 1,
        op_id: m.operation_id(),
        token: *m.token(),
        kind: OperationKind::Read,
        sizes: vec![4096].into(),
        pull: false,
        part: 0,
        parts: 1,
    })
    .encode(&mut frames);
    s.write_all(&frames).await.unwrap();
    let t = Instant::now();
    let e = r
        .wait_for_completion_timeout(bound + Duration::from_secs(2))
        .await
        .unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, Error::PeerUnresponsive { .. }), "{e:?}");
    assert!(took >= bound / 2, "{took:?}");
    // What the peer was sent: the hello, the bytes, the source's finish,
    // heartbeats, then why the request ends, then the end of the stream.
    let (mut pings, mut abort) = (0, None);
    loop {
        let mut h = [0u8; wire::HEADER_LEN];
        if s.read_exact(&mut h).await.is_err() {
            break;
        }
        let header = wire::decode_header(&h).unwrap();
        let mut body = vec![0u8; header.body_len as usize];
        s.read_exact(&mut body).await.unwrap();
        match wire::decode_body(header, &body).unwrap() {
            Message::Data(d) => {
                let mut payload = vec![0u8; d.len as usize];
                s.read_exact(&mut payload).await.unwrap();
            }
            Message::Ping => pings += 1,
            Message::Abort(a) => abort = Some(a),
            _ => {}
        }
    }
    let a = abort.expect("the peer is told why");
    assert_eq!((a.req, a.reason), (1, AbortReason::PeerUnresponsive));
    assert_eq!(a.reason.code(), 15);
    assert!(pings >= 1, "heartbeats were sent first");
}
