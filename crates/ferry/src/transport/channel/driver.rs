//! A driver of the session (`ferry_proto::session`) over one end of an
//! in-process channel (`link.rs`): the same protocol core the TCP driver
//! runs, with the same handshake's first frames (`Hello` both ways, the
//! version checked), the same liveness rules (`session::liveness`) and the
//! same typed errors, and no socket. Bytes move in band (`Data` frames);
//! nothing is lent, so no lane is agreed on.
//!
//! One task per endpoint owns its session, its receive buffer and its
//! liveness: it reads what the channel brings, feeds the frames to the
//! session, does what the session asks, and ends every operation of the
//! connection with the connection's error when the channel closes, the
//! peer breaks the protocol, or the peer falls silent while an operation
//! is in progress.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::session::{
    Action, Caps, Fence, Last, Liveness, OpenParams, Role, Session, Start, Step, Tick,
};
use ferry_proto::wire::{self, Abort, AbortReason, Data, Hello, Message, Open, PROTOCOL_VERSION};
use ferry_proto::{Cursor, OperationKind, Token};
use tokio::sync::{mpsc, watch};

use super::link::End;
use crate::sync::lock;
use crate::{Error, PeerMisbehaved};

/// The most payload bytes in one `Data` frame this driver sends.
const CHUNK: u32 = 64 * 1024;

/// One operation's memory and outcome, as the session's handle on it.
#[derive(Clone)]
pub(crate) struct Op(Arc<OpInner>);

struct OpInner {
    mem: Mutex<Vec<u8>>,
    sealed: AtomicBool,
    open: AtomicBool,
    end: watch::Sender<Option<Result<(), Error>>>,
}

impl Op {
    /// An operation over `bytes` (one descriptor).
    pub(crate) fn new(bytes: Vec<u8>) -> Op {
        Op(Arc::new(OpInner {
            mem: Mutex::new(bytes),
            sealed: AtomicBool::new(false),
            open: AtomicBool::new(true),
            end: watch::channel(None).0,
        }))
    }

    /// Its memory now.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        lock(&self.0.mem).clone()
    }

    fn len(&self) -> u64 {
        lock(&self.0.mem).len() as u64
    }

    /// How it ended, once it has.
    pub(crate) async fn wait(&self) -> Result<(), Error> {
        let mut rx = self.0.end.subscribe();
        let ended = rx.wait_for(Option::is_some).await;
        match ended.as_deref() {
            Ok(Some(r)) => r.clone(),
            _ => Err(Error::Shutdown),
        }
    }

    /// Ends it with `r`, unless it has ended (the first end stands).
    fn end(&self, r: Result<(), Error>) {
        self.0.open.store(false, Ordering::Release);
        self.0.end.send_if_modified(|e| {
            if e.is_some() {
                return false;
            }
            *e = Some(r);
            true
        });
    }

    /// Lands `bytes` at `offset` (the session checked that they belong).
    fn land(&self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        let mut mem = lock(&self.0.mem);
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        match mem.get_mut(at..at.saturating_add(bytes.len())) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(channel_error("data outside the operation's memory")),
        }
    }
}

impl Fence for Op {
    fn is_sealed(&self) -> bool {
        self.0.sealed.load(Ordering::Acquire)
    }

    fn is_open(&self) -> bool {
        self.0.open.load(Ordering::Acquire)
    }

    fn can_commit(&self) -> bool {
        true
    }
}

/// An operation a passive endpoint serves: the peer opens it by id and
/// token, with the kind the active side must ask for.
pub(crate) struct Exposed {
    pub(crate) op_id: u64,
    pub(crate) token: Token,
    /// `Read`: the peer reads this memory; `Write`: it writes into it.
    pub(crate) kind: OperationKind,
    pub(crate) op: Op,
}

/// How an endpoint runs.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// This endpoint's worker id (its `Hello`).
    pub(crate) worker_id: String,
    /// The liveness bound (`None`: off).
    pub(crate) liveness: Option<Duration>,
}

/// What an endpoint's owner asks of its task.
enum Cmd {
    /// Begin an active request.
    Open(OpenParams, Op),
    /// Cancel an active request's operation.
    Cancel(Op),
}

/// One endpoint of a connection over an in-process channel.
pub(crate) struct Endpoint {
    cmds: mpsc::UnboundedSender<Cmd>,
    closed: watch::Receiver<Option<Error>>,
}

impl Endpoint {
    /// Starts an endpoint of `role` on `end`; a passive one serves
    /// `exposed`. Its task runs on the current tokio runtime.
    pub(crate) fn start(role: Role, end: End, cfg: Config, exposed: Vec<Exposed>) -> Endpoint {
        let (cmds, rx) = mpsc::unbounded_channel();
        let (closed_tx, closed) = watch::channel(None);
        let d = Driver {
            link: end,
            peer: String::new(),
            me: cfg.worker_id,
            session: None,
            role,
            buf: Vec::new(),
            payload: None,
            exposed,
            liveness: Liveness::new(cfg.liveness, Instant::now()),
            waiting: Vec::new(),
            active: Vec::new(),
        };
        tokio::spawn(async move {
            let err = d.run(rx).await;
            let _ = closed_tx.send(Some(err));
        });
        Endpoint { cmds, closed }
    }

    /// Begins an active operation of `kind` on the peer's operation
    /// `op_id` (with `token`): a READ fills `op`'s memory, a WRITE sends
    /// it. Its outcome is `op`'s ([`Op::wait`]).
    pub(crate) fn begin(&self, kind: OperationKind, op_id: u64, token: Token, op: &Op) {
        let params = OpenParams {
            kind,
            op_id,
            token,
            sizes: vec![op.len()],
            pull: false,
            lane: None,
            part: (0, 1),
        };
        if self.cmds.send(Cmd::Open(params, op.clone())).is_err() {
            op.end(Err(Error::Shutdown));
        }
    }

    /// Cancels `op`, an active operation of this endpoint, unless it has
    /// ended or is sealed (then the outcome is the peer's): it ends
    /// `Cancelled`, no byte lands in it any more, and the peer is told.
    pub(crate) fn cancel(&self, op: &Op) {
        let _ = self.cmds.send(Cmd::Cancel(op.clone()));
    }

    /// Waits for the connection's end: the error that ended it.
    pub(crate) async fn closed(&self) -> Error {
        let mut rx = self.closed.clone();
        let ended = rx.wait_for(Option::is_some).await;
        match ended.as_deref() {
            Ok(Some(e)) => e.clone(),
            _ => Error::Shutdown,
        }
    }
}

/// The payload of a `Data` frame still to read: into an operation's
/// memory at `offset`, or dropped.
struct Payload {
    op: Option<Op>,
    offset: u64,
    remaining: u64,
}

struct Driver {
    link: End,
    /// The peer's worker id, once it said hello.
    peer: String,
    me: String,
    /// Set up by the peer's `Hello`.
    session: Option<Session<Op>>,
    role: Role,
    buf: Vec<u8>,
    payload: Option<Payload>,
    exposed: Vec<Exposed>,
    liveness: Liveness,
    /// Operations begun before the handshake ended.
    waiting: Vec<(OpenParams, Op)>,
    /// This side's requests and their operations.
    active: Vec<(u64, Op)>,
}

fn channel_error(what: &str) -> Error {
    Error::Protocol {
        peer: String::new(),
        violation: PeerMisbehaved::Channel(what.into()),
    }
}

impl Driver {
    async fn run(mut self, mut cmds: mpsc::UnboundedReceiver<Cmd>) -> Error {
        let hello = Message::Hello(Hello {
            version: PROTOCOL_VERSION,
            worker_id: self.me.clone(),
        });
        if let Err(e) = self.send(&hello) {
            return self.close(e);
        }
        let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let mut taking = true;
        loop {
            if let Err(e) = self.flush() {
                return self.close(e);
            }
            let busy = self.session.as_ref().is_some_and(|s| s.live() > 0);
            self.liveness.set_busy(busy, Instant::now());
            let due = self.liveness.poll_timeout();
            if let Some(at) = due {
                self.liveness.armed(at);
                timer.as_mut().reset(at.into());
            }
            tokio::select! {
                chunk = self.link.recv() => {
                    let Some(bytes) = chunk else {
                        let cause = "the in-process channel closed".to_string();
                        let peer = self.peer.clone();
                        return self.close(Error::ConnectionLost { peer, cause });
                    };
                    self.liveness.on_frame(Instant::now());
                    self.buf.extend_from_slice(&bytes);
                    if let Err(e) = self.parse() {
                        return self.close(e);
                    }
                }
                c = cmds.recv(), if taking => match c {
                    Some(Cmd::Open(params, op)) => self.waiting.push((params, op)),
                    Some(Cmd::Cancel(op)) => {
                        if let Err(e) = self.cancel(&op) {
                            return self.close(e);
                        }
                    }
                    None => taking = false,
                },
                _ = timer.as_mut(), if due.is_some() => {
                    match self.liveness.on_timeout(Instant::now()) {
                        Tick::Wait => {}
                        Tick::Ping => {
                            if let Err(e) = self.send(&Message::Ping) {
                                return self.close(e);
                            }
                        }
                        Tick::Unresponsive { after } => {
                            if let Some(s) = self.session.as_mut() {
                                s.unresponsive(&format!("nothing heard for {after:?}"));
                            }
                            let _ = self.flush();
                            let peer = self.peer.clone();
                            return self.close(Error::PeerUnresponsive { peer, after });
                        }
                    }
                }
            }
            if self.session.is_some() {
                for (params, op) in std::mem::take(&mut self.waiting) {
                    if let Err(e) = self.begin(params, op) {
                        return self.close(e);
                    }
                }
            }
        }
    }

    /// Ends every operation of the connection with `err`, and the channel.
    fn close(mut self, err: Error) -> Error {
        let err = match err {
            Error::Protocol { violation, .. } => Error::Protocol {
                peer: self.peer.clone(),
                violation,
            },
            e => e,
        };
        if let Some(s) = self.session.as_mut() {
            let (reqs, lent) = s.drain();
            for op in reqs.into_iter().chain(lent) {
                op.end(Err(err.clone()));
            }
        }
        for (_, op) in self.waiting.drain(..) {
            op.end(Err(err.clone()));
        }
        err
    }

    fn send(&mut self, m: &Message) -> Result<(), Error> {
        self.send_raw(m.to_vec())
    }

    fn send_raw(&mut self, bytes: Vec<u8>) -> Result<(), Error> {
        self.liveness.on_sent(Instant::now());
        self.link.send(bytes).map_err(|_| Error::ConnectionLost {
            peer: self.peer.clone(),
            cause: "the in-process channel closed".into(),
        })
    }

    /// Feeds what the buffer holds to the session: whole frames, and the
    /// payload bytes that follow a `Data` frame (as they come).
    fn parse(&mut self) -> Result<(), Error> {
        loop {
            if let Some(p) = self.payload.as_mut() {
                let n = p.remaining.min(self.buf.len() as u64) as usize;
                if n == 0 {
                    return Ok(());
                }
                // Nothing lands once the operation ended here (a cancel).
                if let Some(op) = p.op.as_ref().filter(|op| op.is_open()) {
                    op.land(p.offset, &self.buf[..n])?;
                }
                self.buf.drain(..n);
                p.offset += n as u64;
                p.remaining -= n as u64;
                if p.remaining == 0 {
                    self.payload = None;
                }
                continue;
            }
            let (msg, used) = match wire::decode_frame(&self.buf) {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(()),
                Err(e) => {
                    let violation = PeerMisbehaved::Wire(e);
                    let peer = self.peer.clone();
                    return Err(Error::Protocol { peer, violation });
                }
            };
            self.buf.drain(..used);
            self.on_frame(msg)?;
            self.flush()?;
        }
    }

    fn on_frame(&mut self, msg: Message) -> Result<(), Error> {
        let Some(s) = self.session.as_mut() else {
            return self.on_hello(msg);
        };
        let step = s.handle_frame(msg).map_err(|v| Error::Protocol {
            peer: self.peer.clone(),
            violation: PeerMisbehaved::Session(v),
        });
        let step = match step {
            Ok(step) => step,
            Err(e) => {
                // The session's word to the peer goes out first.
                let _ = self.flush();
                return Err(e);
            }
        };
        match step {
            Step::Done => {}
            Step::Payload {
                target,
                desc,
                offset,
                len,
            } => {
                if desc != 0 {
                    return Err(channel_error("data for a descriptor this side has not"));
                }
                self.payload = Some(Payload {
                    op: Some(target),
                    offset,
                    remaining: u64::from(len),
                });
            }
            Step::Discard { len } => {
                self.payload = Some(Payload {
                    op: None,
                    offset: 0,
                    remaining: u64::from(len),
                })
            }
            Step::CheckGrant(o) => self.bind(o),
            // No digest is asked for on this channel (it is off), and no
            // lane is known: the session refuses an offer of one itself.
            Step::Verify { .. } => return Err(channel_error("a digest nobody asked for")),
            Step::LaneOffer { .. } => {}
            // No grant is served over this channel, nor asked for.
            Step::ServeGrant(_)
            | Step::GrantReply(_)
            | Step::ServeClaim(_)
            | Step::OfferReply(_) => {
                return Err(channel_error(
                    "a grant request on a channel that serves none",
                ))
            }
        }
        Ok(())
    }

    /// The peer's first frame must be its `Hello`, of this version: the
    /// session starts then.
    fn on_hello(&mut self, msg: Message) -> Result<(), Error> {
        let Message::Hello(h) = msg else {
            return Err(Error::Protocol {
                peer: String::new(),
                violation: PeerMisbehaved::Expected("a hello"),
            });
        };
        self.peer = h.worker_id;
        if h.version != PROTOCOL_VERSION {
            let violation = PeerMisbehaved::Version {
                theirs: h.version,
                ours: PROTOCOL_VERSION,
            };
            let peer = self.peer.clone();
            return Err(Error::Protocol { peer, violation });
        }
        self.session = Some(Session::new(self.role, Caps::default()));
        Ok(())
    }

    /// Checks request `o` against the operations this side serves, and
    /// binds it (or refuses it, the peer told why).
    fn bind(&mut self, o: Open) {
        let verdict = match self.exposed.iter().find(|e| e.op_id == o.op_id) {
            None => Err((AbortReason::UnknownOperation, "no such operation")),
            Some(e) if e.token != o.token => Err((AbortReason::BadToken, "wrong token")),
            Some(e) if !e.op.is_open() => Err((AbortReason::OperationEnded, "it ended")),
            Some(e) if e.kind != o.kind => Err((AbortReason::WrongKind, "wrong kind")),
            Some(e) if o.sizes.first_difference(&[e.op.len()]).is_some() => {
                Err((AbortReason::SizeMismatch, "other sizes"))
            }
            Some(e) => Ok(e.op.clone()),
        };
        let Some(s) = self.session.as_mut() else {
            return;
        };
        let bound = verdict.is_ok();
        s.bound(&o, verdict.map_err(|(r, why)| (r, why.to_string())));
        if bound {
            s.serve(o.req);
        }
    }

    /// Begins active request `params` on `op`, as the session says.
    fn begin(&mut self, params: OpenParams, op: Op) -> Result<(), Error> {
        let Some(s) = self.session.as_mut() else {
            self.waiting.push((params, op));
            return Ok(());
        };
        let (req, start) = s.open(params, op.clone());
        self.active.retain(|(_, op)| op.is_open());
        self.active.push((req, op.clone()));
        match start {
            Start::Open(m) => self.send(&m),
            Start::Stream { open, cursor, last } => {
                self.send(&open)?;
                self.stream(req, &op, cursor, last)
            }
            // Nothing is lent here: no lane was agreed on.
            Start::OpenAndLease(..) => {
                op.end(Err(channel_error(
                    "a lease on a channel that lends nothing",
                )));
                Ok(())
            }
        }
    }

    /// Cancels active operation `op` (see [`Endpoint::cancel`]): ended
    /// here first, so that no byte lands in it, then forgotten by the
    /// session and the peer told. An operation begun before the handshake
    /// ended never opened: it just ends.
    fn cancel(&mut self, op: &Op) -> Result<(), Error> {
        if !op.is_open() || op.is_sealed() {
            return Ok(());
        }
        op.end(Err(Error::Cancelled));
        self.waiting.retain(|(_, w)| !Arc::ptr_eq(&w.0, &op.0));
        let Some(&(req, _)) = self.active.iter().find(|(_, a)| Arc::ptr_eq(&a.0, &op.0)) else {
            return Ok(());
        };
        if let Some(s) = self.session.as_mut() {
            s.forget(req);
        }
        self.send(&Message::Abort(Abort {
            req,
            reason: AbortReason::Cancelled,
            detail: String::new(),
        }))
    }

    /// Sends the bytes under `cursor` from `op`'s memory, then the
    /// `Finish` that ends them as `last` says.
    fn stream(&mut self, req: u64, op: &Op, mut cursor: Cursor, last: Last) -> Result<(), Error> {
        let mem = op.bytes();
        while let Some((desc, offset, len)) = cursor.next_chunk(CHUNK) {
            let at = offset as usize;
            let Some(bytes) = mem.get(at..at.saturating_add(len as usize)) else {
                return Err(channel_error("a stream past the operation's memory"));
            };
            let mut frame = Message::Data(Data {
                req,
                desc,
                offset,
                len,
            })
            .to_vec();
            frame.extend_from_slice(bytes);
            self.send_raw(frame)?;
            if cursor.accept(desc, offset, len).is_err() {
                return Err(channel_error("a stream out of its own order"));
            }
        }
        match last {
            Last::Seal | Last::SealAfterParts => {
                // Sealed as the `Finish` goes: a cancel no longer changes
                // the outcome.
                if op.is_open() {
                    op.0.sealed.store(true, Ordering::Release);
                    self.send(&Message::Finish { req })?;
                }
            }
            Last::Part => {
                self.send(&Message::Finish { req })?;
                if let Some(s) = self.session.as_mut() {
                    s.part_sent(req);
                }
            }
        }
        Ok(())
    }

    /// Does what the session asked, in order.
    fn flush(&mut self) -> Result<(), Error> {
        loop {
            let Some(a) = self.session.as_mut().and_then(|s| s.poll_action()) else {
                return Ok(());
            };
            match a {
                Action::Send { msg, .. } => self.send(&msg)?,
                Action::Stream {
                    req,
                    target,
                    cursor,
                    last,
                } => self.stream(req, &target, cursor, last)?,
                Action::Commit { req, target, .. } => {
                    // The destination has every byte: sealed, confirmed,
                    // complete once the confirmation is on its way.
                    if target.is_open() {
                        target.0.sealed.store(true, Ordering::Release);
                        self.send(&Message::Finish { req })?;
                        target.end(Ok(()));
                    }
                }
                Action::Complete { target } => target.end(Ok(())),
                Action::RemoteAbort {
                    target,
                    reason,
                    detail,
                } => target.end(Err(match reason {
                    AbortReason::Cancelled => Error::RemoteCancelled,
                    reason => Error::Rejected { reason, detail },
                })),
                // Nothing is lent on this channel, and nothing striped.
                Action::Lend { req, .. } => {
                    if let Some(s) = self.session.as_mut() {
                        s.lend_failed(req, "nothing is lent on an in-process channel");
                    }
                }
                Action::Via { .. }
                | Action::SendLease { .. }
                | Action::GiveBack { .. }
                | Action::Pull { .. }
                | Action::PartDone { .. } => {}
            }
        }
    }
}
