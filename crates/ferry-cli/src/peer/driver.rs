//! The driving side of the peer protocol: [`PeerProcess`] starts a `ferry
//! peer` child (or connects to a `ferry bench --role target`), sends
//! requests and routes each answer to its request's [`Answers`].

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::{Event, Request};

type Writer = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// A peer driven by this process: a child process on a pipe, or a remote
/// peer on a TCP control connection.
pub struct PeerProcess {
    child: Option<Child>,
    stdin: tokio::sync::Mutex<Writer>,
    routes: Routes,
    next_id: std::sync::atomic::AtomicU64,
    /// The peer's worker id.
    pub worker_id: String,
}

type Routes = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Event>>>>;

/// The answers to one request.
pub struct Answers {
    rx: mpsc::UnboundedReceiver<Event>,
    routes: Routes,
    /// The request's id.
    pub id: u64,
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.routes.lock().unwrap().remove(&self.id);
    }
}

impl Answers {
    /// The next answer; an error if the peer died first.
    pub async fn next(&mut self) -> anyhow::Result<Event> {
        self.rx.recv().await.ok_or_else(|| {
            anyhow!(
                "the peer process exited before answering request {}",
                self.id
            )
        })
    }

    /// An answer that has already arrived, without waiting.
    pub fn try_next(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// The next answer, which must be of kind `event`.
    pub async fn expect(&mut self, event: &str) -> anyhow::Result<Event> {
        let e = self.next().await?;
        if e.event != event {
            bail!("expected {event:?} from the peer, got {e:?}");
        }
        Ok(e)
    }
}

impl PeerProcess {
    /// Starts `exe peer` with these extra arguments and environment.
    pub async fn spawn(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::spawn_in(&[], exe, args, env).await
    }

    /// As [`spawn`](Self::spawn), through `wrapper`: a command that runs the
    /// rest of its arguments as it is, such as `ip netns exec NAME` (which
    /// replaces itself with the peer, so that [`kill`](Self::kill) reaches it).
    pub async fn spawn_in(
        wrapper: &[&str],
        exe: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.arg("peer")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().with_context(|| {
            let mut what = wrapper.join(" ");
            what.push_str(if wrapper.is_empty() { "" } else { " " });
            format!("starting {what}{}", exe.display())
        })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        Self::start(Some(child), Box::new(stdin), stdout).await
    }

    /// Drives a peer that serves its protocol on a TCP control address
    /// (`ferry bench --role target`).
    pub async fn connect(addr: &str) -> anyhow::Result<Self> {
        let s = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to the target's control address {addr}"))?;
        s.set_nodelay(true)?;
        let (r, w) = s.into_split();
        Self::start(None, Box::new(w), r).await
    }

    async fn start<R>(child: Option<Child>, stdin: Writer, stdout: R) -> anyhow::Result<Self>
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
    {
        let routes: Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Event>>>> = Default::default();
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
        routes.lock().unwrap().insert(0, ready_tx);
        let r = routes.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(ev) = serde_json::from_str::<Event>(&line) else {
                    eprintln!("peer said something that is not an event: {line}");
                    continue;
                };
                if let Some(tx) = r.lock().unwrap().get(&ev.id) {
                    let _ = tx.send(ev);
                }
            }
            r.lock().unwrap().clear();
        });
        let ready = tokio::time::timeout(Duration::from_secs(30), ready_rx.recv())
            .await
            .context("the peer did not get ready within 30 s")?
            .ok_or_else(|| anyhow!("the peer process exited at start"))?;
        routes.lock().unwrap().remove(&0);
        Ok(PeerProcess {
            child,
            stdin: tokio::sync::Mutex::new(stdin),
            routes,
            next_id: std::sync::atomic::AtomicU64::new(1),
            worker_id: ready.worker_id.unwrap_or_default(),
        })
    }

    /// A fresh request id.
    pub fn next_id(&self) -> u64 {
        self.next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends a request (its `id` is replaced by a fresh one).
    pub async fn request(&self, mut r: Request) -> anyhow::Result<Answers> {
        r.id = self.next_id();
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes.lock().unwrap().insert(r.id, tx);
        let mut line = serde_json::to_vec(&r)?;
        line.push(b'\n');
        let mut stdin = self.stdin.lock().await;
        stdin
            .write_all(&line)
            .await
            .context("writing to the peer")?;
        stdin.flush().await?;
        Ok(Answers {
            rx,
            routes: self.routes.clone(),
            id: r.id,
        })
    }

    /// The operating system's process id (for a child process).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Waits for the child process to exit on its own, and returns its exit
    /// code (`None`: it ended by a signal, or this peer is no child).
    pub async fn exit_code(&mut self) -> anyhow::Result<Option<i32>> {
        match &mut self.child {
            Some(c) => Ok(c.wait().await?.code()),
            None => Ok(None),
        }
    }

    /// Kills the child process with SIGKILL and waits for it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(c) = &mut self.child {
            c.kill().await?;
        }
        Ok(())
    }
}
