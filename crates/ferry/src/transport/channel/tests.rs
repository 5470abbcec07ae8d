//! The session between two in-process endpoints, under each fault the
//! channel injects: clean, split anywhere and delayed (the bytes still
//! land), stalled mid-payload (liveness ends it with `PeerUnresponsive`,
//! and the peer hears why), cut mid-transfer (both sides see the loss),
//! and hostile frames from a raw peer, split anywhere (typed violations).

use std::time::{Duration, Instant};

use ferry_proto::session::{Fence, Role, Violation};
use ferry_proto::wire::{AbortReason, Data, Hello, Message, Open, PROTOCOL_VERSION};
use ferry_proto::{OperationKind, Token};

use super::driver::{Config, Endpoint, Exposed, Op};
use super::link::{pair, End, FaultHandle, Faults, Way};
use crate::{Error, PeerMisbehaved};

const TOKEN: Token = Token::from_bytes([7; 16]);
/// The passive side's readable and writable.
const READABLE: u64 = 1;
const WRITABLE: u64 = 2;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn config(name: &str, liveness: Option<Duration>) -> Config {
    Config {
        worker_id: name.into(),
        liveness,
    }
}

/// A passive endpoint serving a readable of `pattern(len, 1)` and a
/// zeroed writable of `len` bytes, and an active endpoint, over a channel
/// with `faults` (`a`: the active end).
struct World {
    active: Endpoint,
    passive: Endpoint,
    readable: Op,
    writable: Op,
    faults: FaultHandle,
}

fn world(len: usize, faults: Faults, liveness: Option<Duration>) -> World {
    let (a, b, handle) = pair(faults);
    let readable = Op::new(pattern(len, 1));
    let writable = Op::new(vec![0; len]);
    let exposed = vec![
        Exposed {
            op_id: READABLE,
            token: TOKEN,
            kind: OperationKind::Read,
            op: readable.clone(),
        },
        Exposed {
            op_id: WRITABLE,
            token: TOKEN,
            kind: OperationKind::Write,
            op: writable.clone(),
        },
    ];
    World {
        active: Endpoint::start(Role::Active, a, config("active", liveness), Vec::new()),
        passive: Endpoint::start(Role::Passive, b, config("passive", liveness), exposed),
        readable,
        writable,
        faults: handle,
    }
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing after 5 s"))
}

/// A READ of the readable and a WRITE into the writable, both complete on
/// both sides, every byte in place.
async fn both_ways(w: &World, len: usize) {
    let read = Op::new(vec![0; len]);
    w.active.begin(OperationKind::Read, READABLE, TOKEN, &read);
    within("read", read.wait()).await.unwrap();
    within("readable", w.readable.wait()).await.unwrap();
    assert_eq!(read.bytes(), pattern(len, 1));
    let write = Op::new(pattern(len, 2));
    w.active
        .begin(OperationKind::Write, WRITABLE, TOKEN, &write);
    within("write", write.wait()).await.unwrap();
    within("writable", w.writable.wait()).await.unwrap();
    assert_eq!(w.writable.bytes(), pattern(len, 2));
}

#[tokio::test]
async fn an_operation_moves_each_way_without_a_socket() {
    let w = world(200 << 10, Faults::default(), None);
    both_ways(&w, 200 << 10).await;
}

#[tokio::test]
async fn frames_split_anywhere_and_delayed_still_land() {
    for (split, delay) in [(1, 0), (3, 0), (7, 1), (4096 + 5, 2)] {
        let faults = Faults {
            split: Some(split),
            delay: Duration::from_millis(delay),
            ..Faults::default()
        };
        let w = world(20 << 10, faults, None);
        both_ways(&w, 20 << 10).await;
    }
}

#[tokio::test]
async fn a_stall_holds_every_byte_until_it_ends() {
    let len = 20 << 10;
    let w = world(len, Faults::default(), None);
    w.faults.stall();
    let read = Op::new(vec![0; len]);
    w.active.begin(OperationKind::Read, READABLE, TOKEN, &read);
    let held = tokio::time::timeout(Duration::from_millis(50), read.wait()).await;
    assert!(held.is_err(), "nothing moves while stalled: {held:?}");
    assert_eq!(read.bytes(), vec![0; len]);
    w.faults.resume();
    within("read", read.wait()).await.unwrap();
    assert_eq!(read.bytes(), pattern(len, 1));
    // An operation that ended is not served again.
    let again = Op::new(vec![0; len]);
    w.active.begin(OperationKind::Read, READABLE, TOKEN, &again);
    let err = within("again", again.wait()).await.unwrap_err();
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
}

#[tokio::test]
async fn a_stall_mid_payload_ends_it_with_peer_unresponsive() {
    let bound = Duration::from_millis(200);
    let w = world(64 << 10, Faults::default(), Some(bound));
    // The readable's bytes stop 4 KiB in, in the middle of the first
    // `Data` frame's payload; the active side's frames (its pings) still
    // reach the passive side.
    w.faults.set_way(Way::BtoA, |f| f.stall_after = Some(4096));
    let read = Op::new(vec![0; 64 << 10]);
    let t = Instant::now();
    w.active.begin(OperationKind::Read, READABLE, TOKEN, &read);
    let err = within("read", read.wait()).await.unwrap_err();
    assert!(
        matches!(err, Error::PeerUnresponsive { ref peer, after } if peer == "passive" && after >= bound),
        "{err}"
    );
    assert!(t.elapsed() >= bound, "{:?}", t.elapsed());
    assert!(matches!(
        within("active", w.active.closed()).await,
        Error::PeerUnresponsive { .. }
    ));
    // The passive side heard why, before the channel closed.
    let err = within("readable", w.readable.wait()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rejected {
                reason: AbortReason::PeerUnresponsive,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        within("passive", w.passive.closed()).await,
        Error::ConnectionLost { .. }
    ));
}

#[tokio::test]
async fn a_cut_mid_transfer_ends_both_sides_with_connection_lost() {
    let w = world(64 << 10, Faults::default(), None);
    w.faults.set_way(Way::BtoA, |f| f.stall_after = Some(4096));
    let read = Op::new(vec![0; 64 << 10]);
    w.active.begin(OperationKind::Read, READABLE, TOKEN, &read);
    // The passive side sent every byte and sealed; the active side has
    // 4 KiB of them: mid-transfer on both sides.
    within("sealed", async {
        while !w.readable.is_sealed() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    w.faults.cut();
    for (side, op, end) in [
        ("active", &read, &w.active),
        ("passive", &w.readable, &w.passive),
    ] {
        let err = within(side, op.wait()).await.unwrap_err();
        assert!(matches!(err, Error::ConnectionLost { .. }), "{side}: {err}");
        let closed = within(side, end.closed()).await;
        assert!(
            matches!(closed, Error::ConnectionLost { .. }),
            "{side}: {closed}"
        );
    }
}

#[tokio::test]
async fn a_cancel_mid_payload_lands_no_late_byte_and_both_sides_agree() {
    let len = 64 << 10;
    let w = world(len, Faults::default(), None);
    w.faults.set_way(Way::BtoA, |f| f.stall_after = Some(4096));
    let read = Op::new(vec![0; len]);
    w.active.begin(OperationKind::Read, READABLE, TOKEN, &read);
    // Mid-payload: the first bytes landed, the rest is held.
    within("first bytes", async {
        while read.bytes()[0] == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    w.active.cancel(&read);
    let err = within("read", read.wait()).await.unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err}");
    let at_cancel = read.bytes();
    assert_ne!(at_cancel, pattern(len, 1), "cancelled before the end");
    let err = within("readable", w.readable.wait()).await.unwrap_err();
    assert!(matches!(err, Error::RemoteCancelled), "{err}");
    // The held bytes now arrive, and are dropped: the next operation's
    // answer comes after them, and nothing changed in the cancelled one.
    w.faults.set_way(Way::BtoA, |f| f.stall_after = None);
    let write = Op::new(pattern(len, 2));
    w.active
        .begin(OperationKind::Write, WRITABLE, TOKEN, &write);
    within("write", write.wait()).await.unwrap();
    assert_eq!(w.writable.bytes(), pattern(len, 2));
    assert_eq!(read.bytes(), at_cancel, "a byte landed after the cancel");
}

/// A raw peer: its end of a channel whose bytes reach a passive endpoint
/// in pieces of `split` bytes.
fn raw_peer(split: usize, exposed: Vec<Exposed>) -> (End, Endpoint) {
    let faults = Faults {
        split: Some(split),
        ..Faults::default()
    };
    let (a, b, _) = pair(faults);
    let passive = Endpoint::start(Role::Passive, b, config("passive", None), exposed);
    (a, passive)
}

/// What a hostile case must end with.
type Expect = fn(&PeerMisbehaved) -> bool;

fn hello(version: u16) -> Vec<u8> {
    Message::Hello(Hello {
        version,
        worker_id: "raw".into(),
    })
    .to_vec()
}

fn open_write(req: u64, len: u64) -> Vec<u8> {
    Message::Open(Open {
        req,
        op_id: WRITABLE,
        token: TOKEN,
        kind: OperationKind::Write,
        sizes: vec![len].into(),
        pull: false,
        part: 0,
        parts: 1,
    })
    .to_vec()
}

#[tokio::test]
async fn hostile_frames_split_anywhere_are_typed_violations() {
    let data_past_the_end = {
        let mut b = hello(PROTOCOL_VERSION);
        b.extend(open_write(1, 16));
        b.extend(
            Message::Data(Data {
                req: 1,
                desc: 0,
                offset: 0,
                len: 32,
            })
            .to_vec(),
        );
        b.extend([9; 32]);
        b
    };
    let second_hello = [hello(PROTOCOL_VERSION), hello(PROTOCOL_VERSION)].concat();
    let garbage = [hello(PROTOCOL_VERSION), vec![0xEE; 8]].concat();
    let cases: [(&str, Vec<u8>, Expect); 5] = [
        ("another version", hello(PROTOCOL_VERSION + 1), |v| {
            matches!(v, PeerMisbehaved::Version { .. })
        }),
        ("no hello first", Message::Ping.to_vec(), |v| {
            matches!(v, PeerMisbehaved::Expected(_))
        }),
        ("a second hello", second_hello, |v| {
            matches!(v, PeerMisbehaved::Session(Violation::UnexpectedHello))
        }),
        ("bytes that are no frame", garbage, |v| {
            matches!(v, PeerMisbehaved::Wire(_))
        }),
        ("data past the end", data_past_the_end, |v| {
            matches!(v, PeerMisbehaved::Session(_))
        }),
    ];
    for split in [1, 3, 64] {
        for (what, bytes, want) in &cases {
            let writable = Op::new(vec![0; 16]);
            let exposed = vec![Exposed {
                op_id: WRITABLE,
                token: TOKEN,
                kind: OperationKind::Write,
                op: writable.clone(),
            }];
            let (raw, passive) = raw_peer(split, exposed);
            raw.send(bytes.clone()).unwrap();
            let err = within(what, passive.closed()).await;
            match &err {
                Error::Protocol { violation, .. } if want(violation) => {}
                other => panic!("{what} (split {split}): {other}"),
            }
            // The operation it was bound to ends with the same.
            if *what == "data past the end" {
                let ended = within(what, writable.wait()).await.unwrap_err();
                assert!(matches!(ended, Error::Protocol { .. }), "{ended}");
            }
        }
    }
}
