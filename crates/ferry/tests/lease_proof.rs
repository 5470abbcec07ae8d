//! Addresses go only to a peer that proved it can copy them.
//!
//! A lease of host memory names the source's heap addresses. Before the
//! fix, a same-host peer that merely *said* it could copy (`Verdict::CanPull`
//! in its last attach offer) received one, whether or not it had read
//! anything: the verdict was the peer's word. Now each side places, next to
//! its cookie, 16 random bytes of this connection, and a peer's `CanPull`
//! counts only if it echoes them: it read this process's memory (which needs
//! the ptrace access that cross-memory attach needs). Each test drives the
//! protocol by hand, as an attacker would, against a real connector, in
//! both roles:
//!
//! - the connector serves a READ that asked for a lease (it is the passive
//!   side): a peer that claims `CanPull` gets `Data` frames, never a `Lease`;
//! - the connector WRITEs to a peer (it is the active side): the same peer
//!   gets an in-band `Open` and `Data`, never a `Lease`.
//!
//! A peer that does read the bytes and echoes them still gets its lease
//! (the control, in the first test).

use ferry::{OperationKind, RdmaMetadata};
use ferry_proto::wire::{Hello, Message, PROTOCOL_VERSION};
use ferry_proto::{DescriptorInfo, Token};

mod support;
use support::hand::active_cookie;
use support::{
    assert_no_library_panic, attach, attach_round, attaching_connector, expect_attach, open_frame,
    pattern, within, Attach, Raw, Verdict, FAKE_WORKER,
};

const SIZE: usize = 256 << 10;

/// How the hand-driven peer answers the connector's attach offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Says `CanPull`, names no process (the connector cannot verify it)
    /// and read nothing.
    Unverified,
    /// Passes the connector's probe (its cookie lies in this process,
    /// which holds the socket) and says `CanPull`, but read nothing.
    VerifiedButReadNothing,
    /// Passes the probe, reads the connector's bytes of this connection
    /// and echoes them: a peer that can copy.
    Proven,
}

/// The 16 bytes of this connection that a peer must echo: they follow the
/// cookie at the address the offer names (read here by cross-memory
/// attach, as any peer would).
fn read_proof(offered: &Attach) -> [u8; 16] {
    let mut proof = [0u8; 16];
    ferry::cross_memory::copy_from_process(offered.pid, offered.addr + 16, &mut proof)
        .expect("read the connector's proof bytes");
    proof
}

/// A READ by a hand-driven peer that claims it can copy (`claim`): the
/// connector's first answer to an `Open` that asks for a lease.
async fn read_as(claim: Claim) -> Vec<Message> {
    let target = attaching_connector().await;
    let data = pattern(5, SIZE);
    let readable = target
        .create_readable(vec![data.clone().into()])
        .await
        .unwrap();
    let m = readable.metadata().clone();

    let mut r = Raw::connect(&target).await;
    let (act, pas) = (r.s.local_addr().unwrap(), r.s.peer_addr().unwrap());
    let na = [3u8; 16];
    r.send(&attach(std::process::id(), 0, na, Verdict::Unknown))
        .await;
    let offered = expect_attach(&mut r).await;
    assert_ne!(offered.pid, 0, "the connector offers attach on loopback");
    let cookie = Box::new(active_cookie(&na, &offered.cookie, act, pas));
    let (pid, addr, proof) = match claim {
        Claim::Unverified => (0, 0, [0; 16]),
        Claim::VerifiedButReadNothing => (std::process::id(), cookie.as_ptr() as u64, [0; 16]),
        Claim::Proven => (
            std::process::id(),
            cookie.as_ptr() as u64,
            read_proof(&offered),
        ),
    };
    r.send(&attach(pid, addr, proof, Verdict::CanPull)).await;
    let verdict = expect_attach(&mut r).await;
    let verified = claim != Claim::Unverified;
    assert_eq!(
        verdict.verdict,
        if verified {
            Verdict::CanPull
        } else {
            Verdict::Refused
        },
        "{claim:?}: the connector's verdict on this peer"
    );

    let mut open = open_frame(1, &m, OperationKind::Read);
    if let Message::Open(o) = &mut open {
        o.pull = true;
    }
    r.send(&open).await;
    let mut got = Vec::new();
    let mut bytes = Vec::new();
    while bytes.len() < SIZE {
        match within(r.next()).await {
            Some((Message::Lease(l), _)) => {
                got.push(Message::Lease(l));
                break;
            }
            Some((m @ Message::Data(_), payload)) => {
                bytes.extend_from_slice(&payload);
                got.push(m);
            }
            Some((m, _)) => got.push(m),
            None => break,
        }
    }
    if !bytes.is_empty() {
        assert_eq!(bytes, data, "{claim:?}: the bytes in band");
    }
    drop(cookie);
    got
}

fn leases(got: &[Message]) -> Vec<&Message> {
    got.iter()
        .filter(|m| matches!(m, Message::Lease(_)))
        .collect()
}

/// A peer that says it can copy, but names no process the connector can
/// verify and read nothing, asks for a lease: before the fix it got the
/// source's addresses; now the bytes come in band.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_only_claims_it_can_pull_gets_no_addresses() {
    let got = read_as(Claim::Unverified).await;
    assert!(
        leases(&got).is_empty(),
        "a lease went out: {:?}",
        leases(&got)
    );
    assert!(got.iter().any(|m| matches!(m, Message::Data(_))), "{got:?}");
    assert_no_library_panic();
}

/// A peer the connector can copy from (it passed the probe) says it can
/// copy the connector too, without having read anything of it (a process
/// of another user, say, that the connector may read but that may not read
/// the connector): no lease either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_peer_that_read_nothing_gets_no_addresses() {
    let got = read_as(Claim::VerifiedButReadNothing).await;
    assert!(
        leases(&got).is_empty(),
        "a lease went out: {:?}",
        leases(&got)
    );
    assert!(got.iter().any(|m| matches!(m, Message::Data(_))), "{got:?}");
    assert_no_library_panic();
}

/// The control: a peer that read the connector's bytes of this connection
/// and echoes them gets its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_proved_it_can_copy_gets_its_lease() {
    let got = read_as(Claim::Proven).await;
    assert_eq!(leases(&got).len(), 1, "{got:?}");
    assert_no_library_panic();
}

/// The other role: the connector WRITEs to a peer of this host (the peer
/// is the passive side) that declines to be probed yet says it can copy:
/// before the fix the connector lent its buffer (its addresses in a
/// `Lease`); now it sends the bytes in band.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passive_peer_that_only_claims_it_can_pull_gets_no_addresses() {
    let victim = attaching_connector().await;
    // The victim attaches only to a peer of its own host.
    let mine = victim
        .create_readable(vec![vec![0u8; 1].into()])
        .await
        .unwrap();
    let host_id = mine.metadata().host_id().to_string();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let m = RdmaMetadata::new(
        OperationKind::Write,
        FAKE_WORKER.into(),
        "fake-host".into(),
        host_id,
        vec![l.local_addr().unwrap()],
        1,
        Token::from_bytes([7; 16]),
        vec![DescriptorInfo::new(ferry::Device::CPU, SIZE as u64)],
    )
    .unwrap();
    let fake = tokio::spawn(async move {
        let (s, _) = within(l.accept()).await.unwrap();
        let mut r = Raw { s, buf: Vec::new() };
        assert!(matches!(r.next().await, Some((Message::Hello(_), _))));
        r.send(&Message::Hello(Hello {
            version: PROTOCOL_VERSION,
            worker_id: FAKE_WORKER.into(),
        }))
        .await;
        let nonce = expect_attach(&mut r).await;
        assert_eq!(nonce.verdict, Verdict::Unknown, "{nonce:?}");
        // Declines to be probed (pid 0), then says it can copy.
        r.send(&attach_round(1, 0, 0, [0; 16], Verdict::Unknown))
            .await;
        let theirs = expect_attach(&mut r).await;
        assert_eq!(theirs.verdict, Verdict::Refused, "{theirs:?}");
        r.send(&attach_round(3, 0, 0, [0; 16], Verdict::CanPull))
            .await;
        let mut got = Vec::new();
        let mut bytes = Vec::new();
        while bytes.len() < SIZE {
            match within(r.next()).await {
                Some((m @ Message::Lease(_), _)) => {
                    got.push(m);
                    break;
                }
                Some((m @ Message::Data(_), payload)) => {
                    bytes.extend_from_slice(&payload);
                    got.push(m);
                }
                Some((m, _)) => got.push(m),
                None => break,
            }
        }
        (got, bytes, r)
    });
    let data = pattern(9, SIZE);
    let op = victim
        .begin_write(vec![data.clone().into()], &m)
        .await
        .unwrap();
    let (got, bytes, r) = fake.await.unwrap();
    assert!(
        leases(&got).is_empty(),
        "a lease went out: {:?}",
        leases(&got)
    );
    match got.first() {
        Some(Message::Open(o)) => assert!(!o.pull, "{o:?}"),
        other => panic!("expected an Open first, got {other:?}"),
    }
    assert_eq!(bytes, data, "the bytes in band");
    drop((op, r));
    assert_no_library_panic();
}
