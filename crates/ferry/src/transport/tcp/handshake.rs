//! The active side's handshake: hello, authentication, and the lanes'
//! set-up (carried, not decided: see `transport::pull::offer`).

use std::net::SocketAddr;
use std::sync::Arc;

use ferry_proto::lane::LaneId;
use ferry_proto::session::{Caps, LaneProof, Role, Session, Step};
use ferry_proto::wire::{self, AbortReason, Auth, Expect, Hello, Message};
use ferry_proto::RdmaMetadata;
use tokio::net::TcpStream;

use crate::metrics::ConnMeter;
use crate::transport::api::Config;
use crate::transport::pull::exchange::{Exchange, OFFERED};
use crate::transport::pull::offer::{Kept, OfferCtx};
use crate::{Error, PeerMisbehaved, Result};

use super::conn::*;
use super::conn_io::*;
use super::error::ConnError;
use super::reader::*;
use super::request::Target;
use super::secure;
use super::util::*;

/// Connects to `remote`; `attach`: also set up cross-memory attach when
/// it is on this host.
pub(super) async fn connect(
    cfg: &Config,
    remote: &RdmaMetadata,
    attach: bool,
) -> Result<Arc<Conn>> {
    let mut addrs = remote.addresses().to_vec();
    if remote.host_id() == cfg.host_id {
        addrs.sort_by_key(|a| !a.ip().is_loopback());
    } else if addrs.iter().any(|a| !a.ip().is_loopback()) {
        addrs.retain(|a| !a.ip().is_loopback());
    }
    let mut cause = String::from("no address");
    for a in &addrs {
        match tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(a)).await {
            Ok(Ok(s)) => return handshake(cfg, s, *a, remote, attach).await,
            Ok(Err(e)) => cause = format!("{a}: {e}"),
            Err(_) => cause = format!("{a}: connect timed out after {:?}", cfg.connect_timeout),
        }
    }
    Err(Error::Unreachable {
        worker: remote.worker_id().to_string(),
        addresses: addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        cause,
    })
}

pub(super) async fn handshake(
    cfg: &Config,
    s: TcpStream,
    addr: SocketAddr,
    remote: &RdmaMetadata,
    attach: bool,
) -> Result<Arc<Conn>> {
    tune(&s);
    let (local_addr, peer_addr) = (s.local_addr(), s.peer_addr());
    let (r, w) = s.into_split();
    let mut w = ConnWriter::new(w);
    let unreachable = |cause: String| Error::Unreachable {
        worker: remote.worker_id().to_string(),
        addresses: addr.to_string(),
        cause,
    };
    let hello = Message::Hello(Hello {
        version: wire::PROTOCOL_VERSION,
        worker_id: cfg.worker_id.clone(),
    })
    .to_vec();
    let mut first = hello.clone();
    let noise = match &cfg.secret {
        Some(secret) => {
            let (hs, m) =
                secure::Initiator::start(secret, &hello).map_err(|detail| Error::Protocol {
                    peer: addr.to_string(),
                    violation: PeerMisbehaved::Channel(detail),
                })?;
            Message::Auth(Auth { handshake: m }).encode(&mut first);
            Some(hs)
        }
        None => None,
    };
    w.write_all(&first)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let mut rd = FrameReader::new(r);
    let answer = match tokio::time::timeout(HANDSHAKE_TIMEOUT, rd.next()).await {
        Err(_) => return Err(unreachable("no hello from the remote".into())),
        Ok(Err(e)) => return Err(e.into_error(&addr.to_string())),
        Ok(Ok(m)) => m,
    };
    let peer = match answer {
        Message::Hello(h) if h.version == wire::PROTOCOL_VERSION => h.worker_id,
        Message::Hello(h) => {
            return Err(Error::Protocol {
                peer: addr.to_string(),
                violation: PeerMisbehaved::Version {
                    theirs: h.version,
                    ours: wire::PROTOCOL_VERSION,
                },
            })
        }
        _ => {
            return Err(Error::Protocol {
                peer: addr.to_string(),
                violation: PeerMisbehaved::Expected("hello"),
            })
        }
    };
    if peer != remote.worker_id() {
        return Err(Error::WrongWorker {
            address: addr.to_string(),
            expected: remote.worker_id().to_string(),
            found: peer,
        });
    }
    if let Some(noise) = noise {
        let unauthenticated = |detail: &str| Error::Unauthenticated {
            peer: peer.clone(),
            detail: detail.to_string(),
        };
        let answer = rd.next_expecting(Expect::AUTH_ANSWER);
        let theirs = match tokio::time::timeout(HANDSHAKE_TIMEOUT, answer).await {
            Ok(Ok(Message::Auth(a))) => a,
            Ok(Ok(Message::Abort(a))) if a.reason == AbortReason::Unauthenticated => {
                return Err(unauthenticated(&a.detail))
            }
            Ok(Err(ConnError::Unexpected(..))) => {
                return Err(unauthenticated("the remote did not authenticate"))
            }
            Ok(Err(_)) | Err(_) => {
                return Err(unauthenticated(
                    "the remote closed the connection or went silent during authentication",
                ))
            }
            Ok(Ok(_)) => return Err(unauthenticated("the remote did not authenticate")),
        };
        // The hello as received (decoding is exact, so it re-encodes
        // to the same bytes).
        let theirs_hello = Message::Hello(Hello {
            version: wire::PROTOCOL_VERSION,
            worker_id: peer.clone(),
        })
        .to_vec();
        let (tx, rx) = noise
            .finish(&theirs.handshake, &theirs_hello)
            .map_err(unauthenticated)?
            .split();
        rd.secure(rx);
        w.secure(tx);
    }
    let tuple = match (local_addr, peer_addr) {
        (Ok(l), Ok(p)) => Some((l, p)),
        _ => None,
    };
    let caps = Caps {
        attach: cfg.cma,
        secret: cfg.secret.is_some(),
        ..Caps::default()
    };
    let mut session = Session::new(Role::Active, caps);
    session.set_digest(cfg.digest);
    session.set_lanes(&OFFERED);
    let ctx = OfferCtx {
        cma: cfg.cma,
        same_host: remote.host_id() == cfg.host_id,
        tuple,
        // Declined on connections that cannot be trusted with UCX.
        ucx: cfg.ucx.clone().filter(|_| cfg.ucx_trusted),
        ucx_emulated_rma: cfg.ucx_emulated_rma,
    };
    let mut settled = Vec::new();
    if attach {
        let mut set_up = SetUp {
            rd: &mut rd,
            w: &mut w,
            session: &mut session,
            peer: &peer,
            addr,
        };
        for id in OFFERED {
            let Some((exchange, first)) = Exchange::open(id, &ctx) else {
                continue;
            };
            // None once a lane proved a way (the session says).
            let Some(m) = set_up.session.lane_open(id, first) else {
                break;
            };
            let (exchange, proof) = set_up.run(id, exchange, m).await?;
            settled.push((id, exchange, proof));
        }
    }
    let conn = Conn::new(peer, w, cfg.handle.clone(), session, cfg.lanes);
    for (id, exchange, proof) in settled {
        exchange.keep(Kept {
            peers: &conn.peers,
            cookie: &conn.cookie,
        });
        if proof.proves_any() {
            conn.peers.set_proved(id);
        }
    }
    conn.agree_lanes(&mut lock(&conn.session));
    if let Some(t) = tuple {
        let _ = conn.tuple.set(t);
    }
    cfg.handle.spawn(run_connection(
        conn.clone(),
        rd,
        cfg.shutdown.clone(),
        None,
        (cfg.idle_timeout, cfg.liveness),
        ConnMeter::new(&cfg.metrics, false),
    ));
    Ok(conn)
}

/// The active side's part in setting lanes up: it carries each lane's
/// offers to the peer and the peer's back, and decides nothing (the lane's
/// code reads and writes the offers, the session keeps the turns).
struct SetUp<'a> {
    rd: &'a mut FrameReader,
    w: &'a mut ConnWriter,
    session: &'a mut Session<Target>,
    peer: &'a str,
    addr: SocketAddr,
}

impl SetUp<'_> {
    /// Sends `first` (lane `id`'s round 0), then carries the exchange until
    /// the lane settles: the exchange, to keep with the connection, and
    /// what it proved.
    async fn run(
        &mut self,
        id: LaneId,
        mut exchange: Exchange,
        first: Message,
    ) -> Result<(Exchange, LaneProof)> {
        let mut out = Some(first);
        loop {
            if let Some(m) = out.take() {
                self.send(m).await?;
            }
            let (lane, round, bytes) = self.next(id).await?;
            let answer = exchange
                .accept(round, &bytes)
                .await
                .map_err(|e| self.misbehaved(PeerMisbehaved::Wire(e)))?;
            let settled = answer.settled;
            out = self.session.lane_answered(lane, answer);
            if let Some(proof) = settled {
                if let Some(m) = out.take() {
                    self.send(m).await?;
                }
                return Ok((exchange, proof));
            }
        }
    }

    async fn send(&mut self, m: Message) -> Result<()> {
        self.w
            .write_all(&m.to_vec())
            .await
            .map_err(|e| Error::Unreachable {
                worker: self.peer.to_string(),
                addresses: self.addr.to_string(),
                cause: e.to_string(),
            })
    }

    fn misbehaved(&self, violation: PeerMisbehaved) -> Error {
        Error::Protocol {
            peer: self.addr.to_string(),
            violation,
        }
    }

    /// The peer's next offer for lane `id`, as the session takes it.
    async fn next(&mut self, id: LaneId) -> Result<(LaneId, u8, Vec<u8>)> {
        let answer = self.rd.next_expecting(Expect::LANE_ANSWER);
        let frame = match tokio::time::timeout(HANDSHAKE_TIMEOUT, answer).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => return Err(e.into_error(&self.addr.to_string())),
            Err(_) => {
                return Err(Error::Unreachable {
                    worker: self.peer.to_string(),
                    addresses: self.addr.to_string(),
                    cause: format!("no answer to the {id} set-up"),
                })
            }
        };
        match frame {
            // A passive side with a secret refuses a peer without one at
            // its first frame after the hello.
            Message::Abort(a) if a.reason == AbortReason::Unauthenticated => {
                Err(Error::Unauthenticated {
                    peer: self.peer.to_string(),
                    detail: a.detail,
                })
            }
            m @ Message::LaneOffer(_) => match self.session.handle_frame(m) {
                Ok(Step::LaneOffer { lane, round, bytes }) => Ok((lane, round, bytes)),
                Ok(_) => Err(self.misbehaved(PeerMisbehaved::Expected("a lane offer"))),
                Err(v) => Err(self.misbehaved(PeerMisbehaved::Session(v))),
            },
            _ => Err(self.misbehaved(PeerMisbehaved::Expected("a lane offer"))),
        }
    }
}
