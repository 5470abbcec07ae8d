//! Cross-memory attach: one copy between two processes of the same host.
//!
//! The destination's owner always does the copy, with `process_vm_readv`,
//! *into its own memory* and inside its own region's lock (see
//! [`Region::write_at`](crate::region::Region::write_at)). No other process
//! ever writes into a Ferry buffer, so the fence that makes cancellation safe
//! on every other path holds here unchanged: once a cancel or drop returns,
//! no byte lands in that memory. The source side lends its memory for reading
//! ("a lease") and gets it back when the destination says it stopped (its
//! `Finish` or `Abort`) or the connection ends; a source buffer dropped while
//! lent is kept alive until then (see `Region::keep_while_used`).
//!
//! Whether the kernel lets this process read a peer is probed, never assumed:
//! the peer names its pid and the address of 16 random bytes ([`cookie`]),
//! and we read them. That checks the permission (same user and ptrace
//! allowed, no seccomp filter in the way — Docker's default profile refuses)
//! and that the pid means the peer in *our* pid namespace. The 16 bytes
//! after the cookie are random bytes of this connection, which nobody can
//! compute ([`placed`]): a reader echoes them in its verdict, and so proves
//! it read this process's memory. A peer is lent memory (its addresses go
//! to it) only with that proof (`ferry_proto::session::proves`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Which end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Active,
    Passive,
}

/// The 16 bytes that side `side` of one connection places in its memory for
/// the other to read: a hash of both sides' fresh nonces and of the
/// connection's two socket addresses. Nobody can make them appear in a
/// process that is not that side of *this* connection: a replayed or relayed
/// cookie belongs to another connection (other nonces, other addresses), and
/// the reader computes the value itself instead of trusting the wire.
pub(crate) fn cookie(
    side: Side,
    active_nonce: &[u8; 16],
    passive_nonce: &[u8; 16],
    active_addr: SocketAddr,
    passive_addr: SocketAddr,
) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"ferry-cma-cookie-v1\0");
    h.update([match side {
        Side::Active => 1u8,
        Side::Passive => 2u8,
    }]);
    h.update(active_nonce);
    h.update(passive_nonce);
    // Canonical: a dual-stack listener sees `::ffff:127.0.0.1` where the
    // other end sees `127.0.0.1`.
    h.update(canonical(active_addr).to_string().as_bytes());
    h.update([0u8]);
    h.update(canonical(passive_addr).to_string().as_bytes());
    let d = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// What one side of a connection places in its memory for the other to
/// read: its `cookie`, then 16 fresh random bytes (its *proof bytes*),
/// which a reader echoes to prove it read them.
pub(crate) fn placed(cookie: [u8; 16]) -> Box<[u8; 32]> {
    let mut b = Box::new([0u8; 32]);
    b[..16].copy_from_slice(&cookie);
    b[16..].copy_from_slice(&crate::host::random_bytes());
    b
}

/// The proof bytes of what [`placed`] made.
pub(crate) fn proof_of(placed: &[u8; 32]) -> [u8; 16] {
    let mut p = [0u8; 16];
    p.copy_from_slice(&placed[16..]);
    p
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Whether the two ends of a connection are on this host as far as the
/// socket can tell (loopback, or the same address on both ends).
pub(crate) fn is_local(local: SocketAddr, peer: SocketAddr) -> bool {
    let (l, p) = (canonical(local), canonical(peer));
    p.ip().is_loopback() || p.ip() == l.ip()
}

/// The inode of the TCP socket with this own and remote address: asked of
/// the kernel with one `sock_diag` query (microseconds), or, where netlink
/// is not available, found in `/proc/net/tcp{,6}` (each read walks the
/// kernel's whole socket hash: milliseconds).
#[cfg(target_os = "linux")]
pub(crate) fn socket_inode(sock: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let (sock, remote) = (canonical(sock), canonical(remote));
    if let Some(inode) = diag_inode(sock, remote) {
        return Some(inode);
    }
    proc_inode(sock, remote)
}

/// One `SOCK_DIAG_BY_FAMILY` request for exactly this TCP socket (see
/// `linux/inet_diag.h`); `None` if netlink fails or there is no such socket.
#[cfg(target_os = "linux")]
fn diag_inode(sock: SocketAddr, remote: SocketAddr) -> Option<u64> {
    use std::net::IpAddr;
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLMSG_ERROR: u16 = 2;
    const REQ_LEN: usize = 16 + 56; // nlmsghdr + inet_diag_req_v2
    const INODE_AT: usize = 16 + 68; // nlmsghdr + offset in inet_diag_msg
    let family = if sock.is_ipv4() && remote.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let ip16 = |ip: IpAddr| -> [u8; 16] {
        let mut b = [0u8; 16];
        match ip {
            IpAddr::V4(v4) => b[..4].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => b = v6.octets(),
        }
        b
    };
    let mut req = Vec::with_capacity(REQ_LEN);
    // struct nlmsghdr
    req.extend_from_slice(&(REQ_LEN as u32).to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
                                                // struct inet_diag_req_v2
    req.extend_from_slice(&[family as u8, libc::IPPROTO_TCP as u8, 0, 0]);
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
                                                    // struct inet_diag_sockid: ports and addresses in network order
    req.extend_from_slice(&sock.port().to_be_bytes());
    req.extend_from_slice(&remote.port().to_be_bytes());
    req.extend_from_slice(&ip16(sock.ip()));
    req.extend_from_slice(&ip16(remote.ip()));
    req.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // INET_DIAG_NOCOOKIE
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    debug_assert_eq!(req.len(), REQ_LEN);
    // SAFETY: a system call with integer arguments only.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a descriptor this function just opened and owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `req` is valid for reads of `req.len()` bytes for the call.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if n != REQ_LEN as isize {
        return None;
    }
    let mut buf = [0u8; 4096];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call;
    // the kernel answers an exact request at once (no dump, no wait).
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let n = usize::try_from(n).ok()?;
    let msg = buf.get(..n)?;
    let ty = u16::from_ne_bytes(msg.get(4..6)?.try_into().ok()?);
    if ty == NLMSG_ERROR || ty != SOCK_DIAG_BY_FAMILY {
        return None;
    }
    let inode = u32::from_ne_bytes(msg.get(INODE_AT..INODE_AT + 4)?.try_into().ok()?);
    (inode != 0).then_some(u64::from(inode))
}

/// The most lines of each of `/proc/net/tcp{,6}` that [`proc_inode`] reads.
#[cfg(target_os = "linux")]
const MAX_TABLE_LINES: usize = 1 << 16;

/// The `/proc/net/tcp` way to [`socket_inode`], for where netlink fails
/// (bounded: a socket past the first [`MAX_TABLE_LINES`] lines is not found,
/// and cross-memory attach falls back to TCP).
#[cfg(target_os = "linux")]
fn proc_inode(sock: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let (sock, remote) = (canonical(sock), canonical(remote));
    // A socket with an IPv4 address may still be an IPv6 socket (a
    // dual-stack listener's), listed in the IPv6 table only.
    let tables: &[&str] = if sock.is_ipv4() {
        &["/proc/net/tcp", "/proc/net/tcp6"]
    } else {
        &["/proc/net/tcp6"]
    };
    for &file in tables {
        let Ok(text) = std::fs::File::open(file) else {
            continue;
        };
        // Bounded whatever the host holds: the kernel formats the table as
        // it is read, and a peer may open sockets by the thousand.
        let lines = io::BufRead::lines(io::BufReader::new(text));
        for line in lines.skip(1).take(MAX_TABLE_LINES).map_while(Result::ok) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                continue;
            }
            let (Some(l), Some(r)) = (parse_proc_addr(f[1]), parse_proc_addr(f[2])) else {
                continue;
            };
            if canonical(l) == sock && canonical(r) == remote {
                if let Ok(inode) = f[9].parse::<u64>() {
                    if inode != 0 {
                        return Some(inode);
                    }
                }
            }
        }
    }
    None
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6), as the kernel
/// prints them: each 32-bit word in host byte order.
fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_ne_bytes(),
        )
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// This process's id, as the kernel knows it.
pub(crate) fn pid() -> u32 {
    std::process::id()
}

/// Copies `local.len()` bytes from address `remote` of process `pid` into
/// `local`. Fails unless every byte was copied.
pub(crate) fn pull(pid: u32, local: &mut [u8], remote: u64) -> io::Result<()> {
    let len = local.len();
    // SAFETY: `local` is borrowed exclusively for the call, so it is valid
    // for writes of `len` bytes and nothing else touches it meanwhile; one
    // local and one remote range of the same length.
    unsafe { pull_many(pid, &[(local.as_mut_ptr(), len)], &[(remote, len as u64)]) }
}

/// Copies the ranges `remote` (address, length) of process `pid`, in
/// order, into the ranges `local`, in order, in one `process_vm_readv`.
/// Fails unless every byte was copied.
///
/// # Safety
///
/// Every `local[i]` must be valid for writes of its length, and nothing
/// else may read or write that memory during the call (the kernel writes
/// it; overlapping ranges are merely written twice). `local` and `remote`
/// must each have at most `IOV_MAX` (1024) ranges, with equal totals (the
/// call copies the remote ranges, in order, into the local ones, in
/// order).
#[cfg(target_os = "linux")]
pub(crate) unsafe fn pull_many(
    pid: u32,
    local: &[(*mut u8, usize)],
    remote: &[(u64, u64)],
) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let liov: Vec<libc::iovec> = local
        .iter()
        .map(|&(p, n)| libc::iovec {
            iov_base: p.cast(),
            iov_len: n,
        })
        .collect();
    let mut riov = Vec::with_capacity(remote.len());
    for &(a, n) in remote {
        riov.push(libc::iovec {
            iov_base: usize::try_from(a).map_err(|_| io::Error::other("address out of range"))?
                as *mut libc::c_void,
            iov_len: usize::try_from(n).map_err(|_| io::Error::other("length out of range"))?,
        });
    }
    let total: usize = local.iter().map(|l| l.1).sum();
    loop {
        // SAFETY: by this function's contract every local iovec is valid
        // for writes of its length and not accessed by anyone else during
        // the call; the kernel only reads the other process's memory; both
        // arrays live until the call returns and their counts are theirs.
        let n = unsafe {
            libc::process_vm_readv(
                pid,
                liov.as_ptr(),
                liov.len() as libc::c_ulong,
                riov.as_ptr(),
                riov.len() as libc::c_ulong,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n as usize != total {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer's memory ended early",
            ));
        }
        return Ok(());
    }
}

/// See the Linux version.
///
/// # Safety
///
/// As for the Linux version.
#[cfg(not(target_os = "linux"))]
pub(crate) unsafe fn pull_many(
    _pid: u32,
    _local: &[(*mut u8, usize)],
    _remote: &[(u64, u64)],
) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "cross-memory attach needs Linux",
    ))
}

/// How many bytes the `cma` transport copies per system call (and per hold
/// of the destination's lock, so that a cancel waits at most that long) for
/// a large descriptor; also one call's limit for a run of small ones.
pub const CHUNK: usize = 2 * 1024 * 1024;

/// Copies `local.len()` bytes from address `remote` of process `pid` into
/// `local`: the one system call the `cma` transport is built on, for
/// baselines and diagnostics (`ferry bench` measures it raw). It only writes
/// into `local`; a bad address or a refused permission is an error.
pub fn copy_from_process(pid: u32, remote: u64, local: &mut [u8]) -> io::Result<()> {
    pull(pid, local, remote)
}

/// Copies the ranges `remote` of process `pid` (`(address, length)`, in
/// order) into the slices `local` (in order): one vectored
/// `process_vm_readv`, the call the `cma` transport makes for a run of
/// small blocks, for baselines (`ferry bench --workload kv` measures it
/// raw). At most 1024 ranges on each side, with equal totals.
pub fn copy_ranges_from_process(
    pid: u32,
    remote: &[(u64, u64)],
    local: &mut [&mut [u8]],
) -> io::Result<()> {
    let mine: u64 = local.iter().map(|l| l.len() as u64).sum();
    let theirs = remote
        .iter()
        .try_fold(0u64, |t, r| t.checked_add(r.1))
        .ok_or_else(|| io::Error::other("remote lengths overflow"))?;
    if mine != theirs || local.len() > IOV_MAX || remote.len() > IOV_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "at most 1024 ranges on each side, with equal totals",
        ));
    }
    let local: Vec<(*mut u8, usize)> = local
        .iter_mut()
        .map(|l| (l.as_mut_ptr(), l.len()))
        .collect();
    // SAFETY: every local range is a distinct `&mut` slice, valid for writes
    // of its length and borrowed exclusively for the call; the counts and
    // totals were checked above.
    unsafe { pull_many(pid, &local, remote) }
}

/// Whether the 16 bytes at `addr` of `peer` equal `expected`, which is
/// computed only after the read (so that the expected bytes are nowhere in
/// this process's memory while it reads): the peer's proof bytes that
/// follow them (see [`placed`]) if so. May block (the peer's pages may
/// fault): call it from a blocking thread.
pub(crate) fn probe(
    peer: &Peer,
    addr: u64,
    expected: impl FnOnce() -> [u8; 16],
) -> Option<[u8; 16]> {
    let pid = peer.pid;
    let mut got = [0u8; 32];
    match peer.pull(&mut got, addr) {
        Ok(()) => {
            let ok = got[..16] == expected();
            if !ok {
                tracing::debug!(pid, "cross-memory attach: the probe bytes differ (another pid namespace, or not the peer)");
            }
            ok.then(|| proof_of(&got))
        }
        Err(e) => {
            tracing::debug!(pid, "cross-memory attach refused: {e}");
            None
        }
    }
}

/// Linux's `IOV_MAX`: the most ranges one `process_vm_readv` takes.
const IOV_MAX: usize = 1024;

/// A process this one has probed and copies from: its pid, a handle on that
/// very process, and the identity of the program image it ran when it
/// passed the probe.
///
/// A pid names whatever runs under it *now*. The process that passed the
/// probe may replace its program (`exec` keeps the pid) while a child it
/// forked keeps the connection, or exit and leave its pid to another
/// process; a copy by pid would then read a program that never proved
/// anything. So:
///
/// - the handle is the process's `/proc/<pid>` directory, opened before the
///   probe: it never names a later process with the same pid;
/// - at every `exec` the kernel writes 16 fresh random bytes into the new
///   image (the auxiliary vector's `AT_RANDOM`). Every copy reads them as
///   well, first, in the same system call as the data ([`Peer::pull_many`]):
///   one call reads one address space, so data that arrive with the right
///   bytes come from the image that passed the probe; a new image has other
///   bytes there (the copy fails), or nothing mapped (the call fails before
///   it copies anything);
/// - [`Peer::confirm`] also asks the kernel where the *current* image
///   keeps its random bytes (`/proc/<pid>/auxv`, through the handle), which
///   a new image whose layout its launcher arranged (address randomization
///   off, the old bytes planted at the old address among its environment
///   strings) cannot fake. It costs a file open (microseconds): the copy
///   path reads the bytes before a lease's first copy ([`Peer::check`]) and
///   confirms before it seals.
pub(crate) struct Peer {
    pid: u32,
    /// `/proc/<pid>`, opened before the probe.
    dir: OwnedFd,
    /// Where the probed image's `AT_RANDOM` bytes lie, and what they are.
    random_at: u64,
    random: [u8; 16],
}

impl Peer {
    /// Takes hold of process `pid` and notes its image. Blocking (file
    /// system, and the peer's memory): call it from a blocking thread.
    pub(crate) fn open(pid: u32) -> io::Result<Peer> {
        use std::os::unix::fs::OpenOptionsExt;
        if pid == 0 {
            return Err(io::Error::other("pid 0 names no process"));
        }
        let dir: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(format!("/proc/{pid}"))?
            .into();
        let random_at = random_address(&dir)?;
        let mut random = [0u8; 16];
        // By pid: should the pid name another process by now, `unchanged`
        // fails (the handle's process is gone), never the other way round.
        pull(pid, &mut random, random_at)?;
        Ok(Peer {
            pid,
            dir,
            random_at,
            random,
        })
    }

    /// The process's id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// `/proc/<pid>` of this very process.
    pub(crate) fn dir(&self) -> &OwnedFd {
        &self.dir
    }

    /// Who this process is for as long as it runs the probed program: its
    /// pid and its image's random bytes (a pid alone may come to name
    /// another process).
    pub(crate) fn identity(&self) -> (u32, [u8; 16]) {
        (self.pid, self.random)
    }

    /// Whether the process still runs the image it ran when it was probed:
    /// [`Peer::check`], then [`Peer::confirm`]. Blocking, like a copy.
    pub(crate) fn unchanged(&self) -> bool {
        self.check().is_ok() && self.confirm().is_ok()
    }

    /// Whether the process still shows the probed image's random bytes
    /// (one 16-byte read, a microsecond): the copy path's check before a
    /// lease's first copy, so that a process that changed its program
    /// before the lease gets no byte copied. Every copy repeats it.
    pub(crate) fn check(&self) -> io::Result<()> {
        let mut now = [0u8; 16];
        match pull(self.pid, &mut now, self.random_at) {
            Ok(()) if now == self.random => Ok(()),
            _ => Err(self.replaced()),
        }
    }

    /// The kernel's word that the process's current image keeps its random
    /// bytes where the probed image did (an open of `/proc/<pid>/auxv`
    /// through the handle, a few microseconds): after a read of the bytes
    /// (a copy, or [`Peer::check`]), it rules out a new image that merely
    /// shows them at that address (one laid out by its launcher: address
    /// randomization off, the old bytes planted among its environment
    /// strings). An image changes only forwards, so passing both means the
    /// image was the probed one at that read, and during every copy before
    /// it (short of a program of the peer's choosing that execs again in
    /// between, which then reads the peer's own memory). The copy path's
    /// check before it seals.
    pub(crate) fn confirm(&self) -> io::Result<()> {
        match random_address(&self.dir) {
            Ok(a) if a == self.random_at => Ok(()),
            _ => Err(self.replaced()),
        }
    }

    fn replaced(&self) -> io::Error {
        io::Error::other(
            "the process no longer runs the program that passed the attach probe \
             (it replaced it with exec, or exited)",
        )
    }

    /// [`pull`] from this process, failing unless it still runs the probed
    /// image (read in the same system call). Blocking.
    pub(crate) fn pull(&self, local: &mut [u8], remote: u64) -> io::Result<()> {
        let len = local.len();
        // SAFETY: `local` is borrowed exclusively for the call, so it is
        // valid for writes of `len` bytes and nothing else touches it
        // meanwhile; one local and one remote range of the same length.
        unsafe { self.pull_many(&[(local.as_mut_ptr(), len)], &[(remote, len as u64)]) }
    }

    /// [`pull_many`] from this process, failing unless it still runs the
    /// probed image: each system call also reads, first, the image's random
    /// bytes. Blocking.
    ///
    /// # Safety
    ///
    /// As for [`pull_many`] (any number of ranges: calls take at most
    /// `IOV_MAX - 1` each), except that the lengths need not be equal
    /// pairwise when both lists have at most `IOV_MAX - 1` ranges: then
    /// their totals must be equal (one call copies the remote ranges, in
    /// order, into the local ones, in order).
    pub(crate) unsafe fn pull_many(
        &self,
        local: &[(*mut u8, usize)],
        remote: &[(u64, u64)],
    ) -> io::Result<()> {
        for (l, r) in local.chunks(IOV_MAX - 1).zip(remote.chunks(IOV_MAX - 1)) {
            let mut seen = [0u8; 16];
            let mut li = Vec::with_capacity(l.len() + 1);
            li.push((seen.as_mut_ptr(), seen.len()));
            li.extend_from_slice(l);
            let mut ri = Vec::with_capacity(r.len() + 1);
            ri.push((self.random_at, 16));
            ri.extend_from_slice(r);
            // SAFETY: `seen` lives in this frame, valid for writes of 16
            // bytes and touched by nothing else during the call; the other
            // ranges are the caller's, under this function's contract; at
            // most IOV_MAX ranges, equal lengths pairwise or (one call)
            // equal totals.
            let copied = unsafe { pull_many(self.pid, &li, &ri) };
            match copied {
                Ok(()) if seen == self.random => {}
                Ok(()) => return Err(self.replaced()),
                Err(e) => return Err(if self.unchanged() { e } else { self.replaced() }),
            }
        }
        Ok(())
    }
}

/// Opens `name` in directory `dir`, read-only (plus `flags`).
pub(crate) fn open_in(
    dir: &OwnedFd,
    name: &std::ffi::CStr,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated relative path and a descriptor that lives
    // for the call; the result is checked, then owned below.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened here and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Where the kernel placed the `AT_RANDOM` bytes of the image that the
/// process of `dir` (a `/proc/<pid>` directory) runs now.
fn random_address(dir: &OwnedFd) -> io::Result<u64> {
    use std::io::Read;
    const AT_RANDOM: usize = 25;
    const WORD: usize = std::mem::size_of::<usize>();
    let mut file = std::fs::File::from(open_in(dir, c"auxv", 0)?);
    // The kernel's copy of the vector: a few hundred bytes, one read.
    let mut buf = [0u8; 1024];
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let word = |b: &[u8]| b.try_into().map(usize::from_ne_bytes).unwrap_or(0);
    for pair in buf[..n].chunks_exact(2 * WORD) {
        match word(&pair[..WORD]) {
            0 => break,
            AT_RANDOM => return Ok(word(&pair[WORD..]) as u64),
            _ => {}
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "the process has no AT_RANDOM bytes (no memory of its own)",
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn probe_checks_bytes_the_reader_computes() {
        let a: std::net::SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let p: std::net::SocketAddr = "127.0.0.1:2000".parse().unwrap();
        let (na, np) = ([1u8; 16], [2u8; 16]);
        let mine = placed(cookie(Side::Active, &na, &np, a, p));
        let addr = mine.as_ptr() as u64;
        let me = Peer::open(pid()).unwrap();
        // The reader gets the proof bytes, which nobody could compute.
        let proof = probe(&me, addr, || cookie(Side::Active, &na, &np, a, p));
        assert_eq!(proof, Some(proof_of(&mine)));
        assert_ne!(proof_of(&mine), proof_of(&placed([0; 16])));
        // Another role, other nonces or another connection: other bytes.
        assert!(probe(&me, addr, || cookie(Side::Passive, &na, &np, a, p)).is_none());
        assert!(probe(&me, addr, || cookie(Side::Active, &na, &[3; 16], a, p)).is_none());
        assert!(probe(&me, addr, || cookie(Side::Active, &na, &np, p, a)).is_none());
        assert!(Peer::open(0).is_err());
        // An unmapped address is an error, not a crash.
        let mut b = [0u8; 4];
        assert!(pull(pid(), &mut b, 8).is_err());
        assert!(me.pull(&mut b, 8).is_err());
    }

    #[test]
    fn a_peer_is_known_by_the_random_bytes_of_its_image() {
        let me = Peer::open(pid()).unwrap();
        // SAFETY: a libc query with an integer argument.
        let at = unsafe { libc::getauxval(libc::AT_RANDOM) };
        assert_eq!(me.random_at, at as u64);
        assert!(me.unchanged());
        let src = vec![5u8; 3 * CHUNK + 7];
        let mut dst = vec![0u8; src.len()];
        me.pull(&mut dst, src.as_ptr() as u64).unwrap();
        assert_eq!(dst, src);
        // More ranges than one call takes: split, each call checked.
        let mut small = vec![0u8; 2000];
        let local: Vec<(*mut u8, usize)> =
            small.chunks_mut(1).map(|c| (c.as_mut_ptr(), 1)).collect();
        let remote: Vec<(u64, u64)> = (0..2000).map(|i| (src.as_ptr() as u64 + i, 1)).collect();
        // SAFETY: each local range is one byte of `small`, borrowed for the
        // call; lengths match pairwise.
        unsafe { me.pull_many(&local, &remote) }.unwrap();
        assert!(small.iter().all(|&b| b == 5));
        // Another image (other bytes at that address, or another address):
        // every copy fails, and says why.
        let mut other = Peer::open(pid()).unwrap();
        other.random[0] ^= 1;
        assert!(!other.unchanged());
        let e = other.pull(&mut dst[..16], src.as_ptr() as u64).unwrap_err();
        assert!(e.to_string().contains("exec"), "{e}");
        let mut moved = Peer::open(pid()).unwrap();
        moved.random_at = src.as_ptr() as u64;
        moved.random = [5; 16];
        // The bytes are there, but the kernel says the image keeps its own
        // elsewhere: what a new image laid out to show them would look like.
        assert!(moved.check().is_ok());
        assert!(moved.confirm().is_err());
        assert!(!moved.unchanged());
    }

    #[test]
    fn proc_addresses_parse_in_host_order() {
        if cfg!(target_endian = "little") {
            assert_eq!(
                parse_proc_addr("0100007F:1F90"),
                Some("127.0.0.1:8080".parse().unwrap())
            );
            assert_eq!(
                parse_proc_addr("0000000000000000FFFF00000100007F:0050"),
                Some("[::ffff:127.0.0.1]:80".parse().unwrap())
            );
        }
        assert_eq!(parse_proc_addr("zz:1"), None);
        assert_eq!(parse_proc_addr("0100007F"), None);
        assert!(is_local(
            "[::ffff:127.0.0.1]:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap()
        ));
    }
}
