//! The active side's handshake: hello, authentication, and the attach
//! probe.

use std::net::SocketAddr;
use std::sync::Arc;

use ferry_proto::session::{self, Caps, Role, Session};
use ferry_proto::wire::{self, AbortReason, Attach, Auth, Expect, Hello, Message, Rdma, Verdict};
use ferry_proto::RdmaMetadata;
use tokio::net::TcpStream;

use crate::host;
use crate::metrics::ConnMeter;
use crate::transport::api::Config;
use crate::transport::cma;
use crate::transport::probe::verify_peer;
use crate::transport::ucx::{Endpoint, Worker};
use crate::{Error, PeerMisbehaved, Result};

use super::conn::*;
use super::conn_io::*;
use super::error::ConnError;
use super::reader::*;
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
    let (mut peer_pid, mut peer_pulls, mut my_cookie) = (None, false, None);
    // CUDA IPC carries GPU memory only where both processes offer it.
    let offer = crate::cuda::offers_cuda_ipc();
    let mut cuda_ipc = false;
    let tuple = match (local_addr, peer_addr) {
        (Ok(l), Ok(p)) => Some((l, p)),
        _ => None,
    };
    if let Some((me, them)) = tuple.filter(|&(l, p)| {
        attach && cfg.cma && remote.host_id() == cfg.host_id && cma::is_local(l, p)
    }) {
        let next = async |rd: &mut FrameReader| -> Result<Attach> {
            let answer = rd.next_expecting(Expect::ATTACH_ANSWER);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, answer).await {
                Ok(Ok(Message::Attach(a))) => Ok(a),
                // A passive side with a secret refuses a peer without one
                // at its first frame after the hello.
                Ok(Ok(Message::Abort(a))) if a.reason == AbortReason::Unauthenticated => {
                    Err(Error::Unauthenticated {
                        peer: peer.clone(),
                        detail: a.detail,
                    })
                }
                Ok(Ok(_)) => Err(Error::Protocol {
                    peer: addr.to_string(),
                    violation: PeerMisbehaved::Expected("an attach frame"),
                }),
                Ok(Err(e)) => Err(e.into_error(&addr.to_string())),
                Err(_) => Err(unreachable("no answer to attach".into())),
            }
        };
        // 1. Our nonce.
        let na = host::random_bytes();
        let hello = Message::Attach(Attach {
            pid: cma::pid(),
            addr: 0,
            cookie: na,
            verdict: Verdict::Unknown,
            cuda_ipc: offer,
        });
        w.write_all(&hello.to_vec())
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        // 2. Theirs, and where their cookie lies (pid 0: declined).
        let theirs = next(&mut rd).await?;
        let np = theirs.cookie;
        // A peer that declined (pid 0) lends nothing by attach.
        cuda_ipc = offer && theirs.cuda_ipc && theirs.pid != 0;
        // Our cookie, then proof bytes the peer must echo to be lent memory.
        let cookie = cma::placed(cma::cookie(cma::Side::Active, &na, &np, me, them));
        // The passive end of this connection is `them` -> `me`.
        let verified = verify_peer(theirs.pid, theirs.addr, them, me, move || {
            cma::cookie(cma::Side::Passive, &na, &np, me, them)
        })
        .await;
        let ok = verified.is_some();
        // 3. Our verdict (with their proof bytes, read), and where our
        // cookie lies.
        let answer = Message::Attach(Attach {
            pid: cma::pid(),
            addr: cookie.as_ptr() as u64,
            cookie: verified.as_ref().map(|v| v.1).unwrap_or_default(),
            verdict: if ok {
                Verdict::CanPull
            } else {
                Verdict::Refused
            },
            cuda_ipc,
        });
        w.write_all(&answer.to_vec())
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        // 4. Their verdict on us: their word counts only with the proof
        // that they read our memory (our proof bytes, echoed).
        peer_pulls = session::proves(&next(&mut rd).await?, &cma::proof_of(&cookie));
        peer_pid = verified.map(|v| v.0);
        my_cookie = Some(cookie);
        tracing::debug!(
            peer,
            pull_from_peer = ok,
            peer_pulls,
            cuda_ipc,
            "cross-memory attach probed"
        );
    }
    let mut can_pull = peer_pid.is_some();
    let mut ucx_ep = None;
    let mut via_ucx = false;
    let mut ucx_cuda = false;
    if let Some(worker) = cfg.ucx.as_ref().filter(|_| cfg.ucx_trusted && attach) {
        if !can_pull && !peer_pulls {
            let (mine, theirs, both_cuda) =
                set_up_ucx(worker, &mut w, &mut rd, &peer, addr, cfg.ucx_emulated_rma).await?;
            can_pull = mine.is_some();
            peer_pulls = theirs;
            via_ucx = can_pull || peer_pulls;
            // Both moving CUDA memory implies the peer pulls: UCX is set up.
            ucx_cuda = both_cuda;
            ucx_ep = mine;
        }
    }
    let caps = Caps {
        attach: cfg.cma || via_ucx,
        can_pull,
        peer_pulls,
        secret: cfg.secret.is_some(),
        // CUDA IPC goes with cross-memory attach, never with UCX.
        cuda_ipc: cuda_ipc && !via_ucx,
        ucx_cuda,
    };
    let mut session = Session::new(Role::Active, caps);
    session.set_digest(cfg.digest);
    if via_ucx {
        session.rdma_leases();
    }
    let conn = Conn::new(peer, w, cfg.handle.clone(), session, cfg.lanes);
    if let Some(ep) = ucx_ep {
        let _ = conn.peers.ucx.set(Arc::new(ep));
    }
    if via_ucx {
        conn.peers.set_network();
    }
    if let Some(p) = peer_pid {
        let _ = conn.peers.process.set(p);
    }
    *lock(&conn.cookie) = my_cookie;
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

/// The active side of the `Rdma` exchange: sends this worker's address,
/// reads the passive side's answer, reaches its worker, sends the verdict.
/// `(endpoint to the peer, whether the peer reached this worker, whether
/// both sides' UCX moves CUDA memory)`.
async fn set_up_ucx(
    worker: &Arc<Worker>,
    w: &mut ConnWriter,
    rd: &mut FrameReader,
    peer: &str,
    addr: SocketAddr,
    emulated: bool,
) -> Result<(Option<Endpoint>, bool, bool)> {
    let cuda = crate::transport::ucx::moves_cuda();
    let offer = Message::Rdma(Rdma {
        address: worker.address().to_vec(),
        verdict: Verdict::Unknown,
        cuda,
    });
    let lost = |cause: String| Error::Unreachable {
        worker: peer.to_string(),
        addresses: addr.to_string(),
        cause,
    };
    w.write_all(&offer.to_vec())
        .await
        .map_err(|e| lost(e.to_string()))?;
    let answer = rd.next_expecting(Expect::RDMA_ANSWER);
    let answer = match tokio::time::timeout(HANDSHAKE_TIMEOUT, answer).await {
        Ok(Ok(Message::Rdma(a))) => a,
        Ok(Ok(Message::Abort(a))) if a.reason == AbortReason::Unauthenticated => {
            return Err(Error::Unauthenticated {
                peer: peer.to_string(),
                detail: a.detail,
            })
        }
        Ok(Ok(_)) => {
            return Err(Error::Protocol {
                peer: addr.to_string(),
                violation: PeerMisbehaved::Expected("an rdma set-up frame"),
            })
        }
        Ok(Err(e)) => return Err(e.into_error(&addr.to_string())),
        Err(_) => return Err(lost("no answer to the rdma set-up".into())),
    };
    let theirs = answer.verdict == Verdict::CanPull && !answer.address.is_empty();
    let mine = if theirs {
        match worker.connect(&answer.address) {
            Ok(ep) if emulated || ep.has_rma_lane() => Some(ep),
            Ok(_) => {
                tracing::debug!(
                    peer,
                    "UCX: no RMA transport to the peer (gets would be emulated): declined"
                );
                None
            }
            Err(e) => {
                tracing::debug!(peer, "UCX: cannot reach the peer's worker: {e}");
                None
            }
        }
    } else {
        None
    };
    let verdict = Message::Rdma(Rdma {
        address: Vec::new(),
        cuda,
        verdict: if mine.is_some() {
            Verdict::CanPull
        } else {
            Verdict::Refused
        },
    });
    w.write_all(&verdict.to_vec())
        .await
        .map_err(|e| lost(e.to_string()))?;
    let cuda_memory = cuda && answer.cuda && theirs;
    tracing::debug!(
        peer,
        pull_from_peer = mine.is_some(),
        peer_pulls = theirs,
        cuda_memory,
        "UCX set up"
    );
    Ok((mine, theirs, cuda_memory))
}
