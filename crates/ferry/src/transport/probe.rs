//! The attach probe: whether the process a peer names is the other end of
//! this connection, and whether this process may copy from it (see
//! `docs/transports.md`). Bounded whatever the peer does:
//!
//! - **in number**: at most [`MAX_PROBES`] are awaited at once in this
//!   process (one more is refused at once, and its connection uses TCP);
//! - **in time**: a probe that has not answered after its timeout (default
//!   10 s, `FERRY_CMA_PROBE_TIMEOUT_MS`) is a refusal,
//!   and gives its slot back *then*. Its thread may stay stuck for as long as
//!   the peer's page does not arrive (a `userfaultfd` page never served, a
//!   FUSE file that never answers: the kernel offers no way to interrupt the
//!   copy), so probes run on small threads of their own, never on the
//!   runtime's blocking pool, and at most [`MAX_PROBE_THREADS`] of them live
//!   at once, stuck ones included: beyond that, probes are refused (and
//!   come back as soon as stuck ones end: a refusal changes no count);
//! - **in work**: the check that the claimed process holds the peer's
//!   socket examines at most the first 1,024 (by default) of its open
//!   files (`FERRY_CMA_PROBE_FILES`); a socket further down is not looked
//!   for, and the connection uses TCP.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use super::cma::{self, Peer};

/// Probes awaited at once in this process, at most.
pub(crate) const MAX_PROBES: usize = 16;
/// Probe threads alive at once in this process, at most, counting those
/// still stuck after their probe timed out.
pub(crate) const MAX_PROBE_THREADS: usize = 64;
/// A probe thread's stack: the probe needs a few kilobytes.
const PROBE_STACK: usize = 256 * 1024;

/// Runs `probe`, a same-host lane's check that process `pid` is the
/// other end of this connection and that this process may read it (for
/// cross-memory attach: [`attach`]), on a probe thread of its own: what it
/// returns (the peer, and the proof bytes that follow its cookie), or
/// `None` (the lane proves nothing). Bounded as the module says.
pub(crate) async fn verify_peer<T: Send + 'static>(
    pid: u32,
    probe: impl FnOnce() -> Option<T> + Send + 'static,
) -> Option<T> {
    static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_PROBES);
    if pid == 0 {
        return None;
    }
    let Ok(slot) = SLOTS.try_acquire() else {
        tracing::debug!(pid, "cross-memory attach: too many probes at once");
        return None;
    };
    let Some(alive) = ProbeThread::count() else {
        tracing::debug!(
            pid,
            "cross-memory attach: {MAX_PROBE_THREADS} probe threads are still stuck on pages that never arrived"
        );
        return None;
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("ferry-probe".into())
        .stack_size(PROBE_STACK)
        .spawn(move || {
            let _alive = alive;
            let _ = tx.send(probe());
        });
    if let Err(e) = spawned {
        tracing::debug!(pid, "cross-memory attach: no thread for the probe: {e}");
        return None;
    }
    let outcome = tokio::time::timeout(probe_timeout(), rx).await;
    // The slot is free from here on, whatever the thread still does.
    drop(slot);
    match outcome {
        Ok(Ok(peer)) => peer,
        Ok(Err(_)) => None,
        Err(_) => {
            tracing::debug!(
                pid,
                "cross-memory attach: the probe timed out (the peer's memory does not answer)"
            );
            None
        }
    }
}

/// Probe threads alive.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// One live probe thread, counted against [`MAX_PROBE_THREADS`] in its
/// counter.
struct ProbeThread(&'static AtomicUsize);

impl ProbeThread {
    /// One more probe thread, if fewer than [`MAX_PROBE_THREADS`] live.
    fn count() -> Option<ProbeThread> {
        Self::count_in(&THREADS)
    }

    /// One more in `threads`. Only a count that went up makes a
    /// `ProbeThread`, whose drop takes it down again: a refusal leaves the
    /// count as it was.
    fn count_in(threads: &'static AtomicUsize) -> Option<ProbeThread> {
        threads
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_PROBE_THREADS).then_some(n + 1)
            })
            .ok()
            .map(|_| ProbeThread(threads))
    }
}

impl Drop for ProbeThread {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Cross-memory attach's probe, on a probe thread ([`verify_peer`]; it may
/// block on the peer's pages): whether process `pid` is the other end of
/// this connection (the kernel says it holds the socket `sock` ->
/// `remote`) and this process may copy from it (its cookie at `addr` reads
/// as `expected`): the process, held by a handle that notices a new
/// program image, and the proof bytes that follow its cookie (see
/// `cma::placed`: echoed in this side's verdict).
pub(crate) fn attach(
    pid: u32,
    addr: u64,
    sock: SocketAddr,
    remote: SocketAddr,
    expected: impl FnOnce() -> [u8; 16],
) -> Option<(Peer, [u8; 16])> {
    let peer = match Peer::open(pid) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(
                pid,
                "cross-memory attach: cannot take hold of process {pid}: {e}"
            );
            return None;
        }
    };
    if !owns_socket(pid, peer.dir(), sock, remote) {
        return None;
    }
    let proof = cma::probe(&peer, addr, expected)?;
    // The socket check and the cookie saw the image noted at the start.
    if !peer.unchanged() {
        tracing::debug!(
            pid,
            "cross-memory attach: the process changed its program during the probe"
        );
        return None;
    }
    Some((peer, proof))
}

/// Whether process `pid`, whose `/proc/<pid>` directory is `dir` (opened
/// before the check, so that it names that very process), holds the TCP
/// socket whose own address is `sock` and whose remote address is `remote`:
/// the kernel's word on who is at the other end of a connection, which a
/// peer cannot fake by placing bytes anywhere. Any same-host lane that
/// takes a pid from its peer checks it so. Looks at most at the first
/// [`probe_files`] open files of the process (reading them needs the same
/// ptrace access as cross-memory attach). Blocking (file system).
#[cfg(target_os = "linux")]
pub(crate) fn owns_socket(pid: u32, dir: &OwnedFd, sock: SocketAddr, remote: SocketAddr) -> bool {
    let Some(inode) = cma::socket_inode(sock, remote) else {
        tracing::debug!(pid, %sock, %remote, "cross-memory attach: no such socket in this network namespace");
        return false;
    };
    let max = probe_files();
    let (found, examined) = holds_inode(dir, inode, max);
    if !found {
        tracing::debug!(
            pid,
            examined,
            "cross-memory attach: that process does not hold the peer's socket{}",
            if examined >= max {
                " among the open files a probe examines (FERRY_CMA_PROBE_FILES)"
            } else {
                ""
            }
        );
    }
    found
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn owns_socket(
    _pid: u32,
    _dir: &OwnedFd,
    _sock: SocketAddr,
    _remote: SocketAddr,
) -> bool {
    false
}

/// Whether one of the first `max` open files of the process whose
/// `/proc/<pid>` directory is `dir` is the socket `inode`, and how many of
/// them were examined: one `readlinkat` each, in the order of their numbers,
/// listed a few hundred at a time (so that the listing, too, stops soon
/// after `max`).
#[cfg(target_os = "linux")]
fn holds_inode(dir: &OwnedFd, inode: u64, max: usize) -> (bool, usize) {
    /// `getdents64`'s buffer: aligned for the records the kernel writes.
    #[repr(C, align(8))]
    struct Listing([u8; 8192]);
    // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
    const NAME_AT: usize = 19;
    let want = format!("socket:[{inode}]");
    let Ok(fds) = cma::open_in(dir, c"fd", libc::O_DIRECTORY) else {
        tracing::debug!("cross-memory attach: cannot list the peer's files");
        return (false, 0);
    };
    let mut buf = Listing([0; 8192]);
    let mut link = [0u8; 64];
    let mut examined = 0;
    loop {
        // SAFETY: `buf` is valid for writes of its length for the call, and
        // `fds` is an open directory.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fds.as_raw_fd(),
                buf.0.as_mut_ptr(),
                buf.0.len(),
            )
        };
        let Some(mut rest) = usize::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .and_then(|n| buf.0.get(..n))
        else {
            return (false, examined);
        };
        while let Some(len) = rest
            .get(16..18)
            .map(|b| usize::from(u16::from_ne_bytes([b[0], b[1]])))
        {
            let Some(record) = rest.get(..len).filter(|_| len > NAME_AT) else {
                return (false, examined);
            };
            rest = &rest[len..];
            let name = &record[NAME_AT..];
            if name.first() == Some(&b'.') || !name.contains(&0) {
                continue;
            }
            if examined == max {
                return (false, examined);
            }
            examined += 1;
            // SAFETY: `name` holds a NUL inside `buf`, which outlives the
            // call; `link` is valid for writes of its length; `fds` is open.
            let got = unsafe {
                libc::readlinkat(
                    fds.as_raw_fd(),
                    name.as_ptr().cast(),
                    link.as_mut_ptr().cast(),
                    link.len(),
                )
            };
            if usize::try_from(got).is_ok_and(|k| link.get(..k) == Some(want.as_bytes())) {
                return (true, examined);
            }
        }
    }
}

/// How long a probe may take (`FERRY_CMA_PROBE_TIMEOUT_MS`).
fn probe_timeout() -> Duration {
    crate::config::process().probe_timeout.value
}

/// How many open files of the claimed process a probe examines at most
/// (`FERRY_CMA_PROBE_FILES`).
fn probe_files() -> usize {
    crate::config::process().probe_files.value
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::config::DEFAULT_PROBE_FILES;
    use std::net::{TcpListener, TcpStream};
    use std::sync::Mutex;

    /// The tests that open many files, and those that need few: one at a
    /// time.
    static FILES: Mutex<()> = Mutex::new(());

    #[test]
    fn a_refused_probe_thread_leaves_the_count_as_it_was() {
        static N: AtomicUsize = AtomicUsize::new(0);
        let all: Vec<ProbeThread> = (0..MAX_PROBE_THREADS)
            .map(|_| ProbeThread::count_in(&N).expect("below the bound"))
            .collect();
        for _ in 0..3 {
            assert!(ProbeThread::count_in(&N).is_none(), "at the bound");
        }
        assert_eq!(N.load(Ordering::Acquire), MAX_PROBE_THREADS);
        drop(all);
        // Before the fix, each refusal took one off: the count wrapped
        // below zero here, and every later probe was refused.
        assert_eq!(N.load(Ordering::Acquire), 0);
        assert!(ProbeThread::count_in(&N).is_some());
    }

    #[test]
    fn the_kernel_names_the_owner_of_a_socket() {
        let _one = FILES.lock().unwrap_or_else(|e| e.into_inner());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let (me, them) = (c.local_addr().unwrap(), c.peer_addr().unwrap());
        // This process holds both ends.
        let this = Peer::open(cma::pid()).unwrap();
        assert!(owns_socket(this.pid(), this.dir(), me, them));
        assert!(owns_socket(this.pid(), this.dir(), them, me));
        // Another process does not.
        let mut other = std::process::Command::new("sh")
            .args(["-c", "echo up; read x"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut up = [0u8; 3];
        std::io::Read::read_exact(other.stdout.as_mut().unwrap(), &mut up).unwrap();
        let that = Peer::open(other.id()).unwrap();
        assert!(!owns_socket(that.pid(), that.dir(), me, them));
        other.kill().unwrap();
        other.wait().unwrap();
        // A socket that does not exist has no owner.
        assert!(!owns_socket(
            this.pid(),
            this.dir(),
            me,
            "127.0.0.1:1".parse().unwrap()
        ));
        drop((c, s));
    }

    #[test]
    fn a_probe_examines_at_most_its_bound_of_open_files() {
        let _one = FILES.lock().unwrap_or_else(|e| e.into_inner());
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is valid for writes of one `rlimit`.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        let many = usize::try_from(lim.rlim_max)
            .unwrap_or(usize::MAX)
            .min(20_000)
            - 200;
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid `rlimit` (the soft limit up to the hard one).
        if many < 4 * DEFAULT_PROBE_FILES
            || unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0
        {
            eprintln!("skipped: cannot open {many} files");
            return;
        }
        let files: Vec<std::fs::File> = (0..many)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let inode = cma::socket_inode(c.local_addr().unwrap(), c.peer_addr().unwrap()).unwrap();
        let this = Peer::open(cma::pid()).unwrap();
        // Past the bound: not found, and no more examined than the bound.
        assert_eq!(
            holds_inode(this.dir(), inode, DEFAULT_PROBE_FILES),
            (false, DEFAULT_PROBE_FILES)
        );
        // It is there, further down.
        let (found, examined) = holds_inode(this.dir(), inode, usize::MAX);
        assert!(found && examined > many, "{examined}");
        drop((files, c, l));
    }
}
