use std::os::fd::OwnedFd;

use super::*;
use crate::transport::pull::conformance::{host_source, Applies, Backend, Mortal, Source, Stalled};
use crate::transport::pull::twin::Twin;
use ferry_proto::DeviceKind;

/// The `mem` file of process `pid`.
fn peer_of(pid: u32) -> Peer {
    let dir: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .open(format!("/proc/{pid}"))
        .expect("the process's directory")
        .into();
    Peer::open(pid, &dir).expect("open its /proc/<pid>/mem")
}

/// `/proc/<pid>/mem` of this very process, or of a forked twin of it for a
/// source that goes away.
#[derive(Default)]
struct ProcMemBackend(ProcMem);

impl Backend for ProcMemBackend {
    type P = ProcMem;

    fn puller(&self) -> &ProcMem {
        &self.0
    }

    fn chunk(&self, _into: DeviceKind) -> usize {
        CHUNK
    }

    fn source(&self, sizes: &[usize]) -> Source<Peer> {
        host_source(&self.0, sizes, |_| peer_of(cma::pid()))
    }

    fn mortal_source(&self, sizes: &[usize]) -> Applies<Mortal<Peer>> {
        let mut twin = None;
        let source = host_source(&self.0, sizes, |_| {
            let t = Twin::fork();
            let peer = peer_of(t.0 as u32);
            twin = Some(t);
            peer
        });
        let twin = twin.expect("the twin forked");
        Ok((source, Box::new(move || drop(twin))))
    }

    /// Not run: a read of this process's own `/proc/self/mem` that waits
    /// on a `userfaultfd` page hung the test process here (the copy did
    /// not go on once the page was served), so the stuck-copy case is
    /// covered by rule 2 alone (one chunk per copy, as cross-memory
    /// attach) until it is tested against a forked source.
    fn stalled_source(&self, _len: usize) -> Applies<Stalled<Peer>> {
        Err(
            "a read of /proc/self/mem stalled on a userfaultfd page does not resume in this \
             process: not tested here"
                .into(),
        )
    }
}

mod conformance {
    use super::ProcMemBackend;
    use crate::transport::pull::conformance::conformance_tests;

    conformance_tests!(ProcMemBackend::default());
}

#[test]
fn procmem_declares_a_host_lane_of_its_own_proof() {
    let caps = ProcMem.caps();
    assert_eq!(caps.id, LaneId::PROCMEM);
    assert_eq!(caps.proven_by, LaneId::PROCMEM, "rides on nobody's proof");
    assert!(caps.lends == MemKinds::HOST && caps.pulls_into == MemKinds::HOST);
    assert_eq!(LaneId::PROCMEM.to_string(), "procmem");
}

/// Without cross-memory attach: the lane's four offers, both sides in this
/// process over a real connection, prove that each side reads the other
/// through `/proc/<pid>/mem`; the connection agrees on this lane alone,
/// and a lease moves over it.
#[test]
fn the_offers_prove_a_peer_and_a_lease_moves_without_cma() {
    use std::net::{TcpListener, TcpStream};
    use std::sync::Mutex;

    use ferry_proto::lane::Proven;
    use ferry_proto::session::LaneAnswer;

    use super::offer::ProcMemExchange;
    use crate::transport::pull::conformance::{destination, op, pattern, Mem};
    use crate::transport::pull::lanes::{Lanes, Peers};
    use crate::transport::pull::offer::{Kept, LaneOffers, OfferCtx};

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (_s, _) = l.accept().unwrap();
    let ctx = OfferCtx {
        cma: true,
        same_host: true,
        tuple: Some((c.local_addr().unwrap(), c.peer_addr().unwrap())),
        ..OfferCtx::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (active, passive) = rt.block_on(async {
        let (mut a, first) = ProcMemExchange::open(&ctx).expect("offered on this host");
        let mut p = ProcMemExchange::answering(&ctx);
        let bytes = |x: LaneAnswer| x.bytes.expect("an answer");
        let r1 = bytes(p.accept(0, &first).await.unwrap());
        let r2 = bytes(a.accept(1, &r1).await.unwrap());
        let r3 = p.accept(2, &r2).await.unwrap();
        let pp = r3.settled.expect("the passive side settles");
        let ap = a.accept(3, &r3.bytes.unwrap()).await.unwrap().settled;
        let ap = ap.expect("the active side settles");
        assert!(ap.can_pull && ap.peer_pulls && pp.can_pull && pp.peer_pulls);
        assert!(!ap.device && !pp.device, "no CUDA IPC rides on it");
        (a, p)
    });
    drop(passive);
    let (peers, cookie) = (Peers::default(), Mutex::new(None));
    active.keep(Kept {
        peers: &peers,
        cookie: &cookie,
    });
    peers.set_proved(LaneId::PROCMEM);
    let lanes = Lanes::new(true, None);
    let agreed = lanes.agreed(&peers.proven(&Default::default()));
    let ids: Vec<_> = agreed.lanes().iter().map(|c| c.id).collect();
    assert_eq!(ids, [LaneId::PROCMEM], "its own proof serves it alone");
    assert!(lanes.agreed(&Proven::default()).lanes().is_empty());
    let sizes = [5000, 3];
    let src = Mem::new(
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(i, n))
            .collect(),
        false,
    );
    let lease = lanes.lend(LaneId::PROCMEM, &src.region);
    assert_eq!(lease.lane(), LaneId::PROCMEM);
    let peer = peers
        .for_lane(LaneId::PROCMEM, &agreed)
        .unwrap_or_else(|_| panic!("a peer"));
    let dst = destination(&sizes, DeviceKind::Cpu);
    let shared = op();
    let end = lanes.pull(&peer, &lease, &dst.region, &shared);
    assert_eq!(end, PullEnd::Done);
    for (i, &n) in sizes.iter().enumerate() {
        assert!(*dst.bytes(i) == pattern(i, n), "segment {i}");
    }
    assert_eq!(Lanes::kind(LaneId::PROCMEM), TransportKind::Cma);
}
