//! A prefill worker and a decode worker, two processes, handing the KV
//! cache's metadata over NATS, HTTP or etcd:
//!
//! ```text
//! cargo run --release -p ferry-control --example prefill_decode -- --via http
//! cargo run --release -p ferry-control --example prefill_decode -- --via nats [--nats-url nats://127.0.0.1:4222]
//! cargo run --release -p ferry-control --example prefill_decode -- --via etcd [--etcd-url http://127.0.0.1:2379]
//! ```
//!
//! The process started by hand is the decode worker. It spawns the prefill
//! worker (this program again, with `--role prefill`), which exposes a
//! buffer as a readable and publishes its metadata under the request id.
//! The decode worker fetches the metadata, reads the buffer, checks every
//! byte, and both learn that the transfer is done. Without `--nats-url`
//! (`--etcd-url`) it starts a `nats-server` (an `etcd`, with a temporary
//! data directory) of its own on a free port (and says so, and exits 0, if
//! none is installed). Both workers run on loopback, so no
//! secret is needed; with `FERRY_SECRET` in the environment (both inherit
//! it) the hand-over is authenticated and sealed, and the transfer runs
//! over the secure channel.
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ferry::{Connector, Descriptor};
use ferry_control::{EtcdStore, HttpClient, HttpServer, NatsChannel};

const KEY: &str = "request-0001";
const DEADLINE: Duration = Duration::from_secs(10);

struct Args {
    role: String,
    via: String,
    nats_url: Option<String>,
    etcd_url: Option<String>,
    size: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        role: "decode".into(),
        via: "http".into(),
        nats_url: None,
        etcd_url: None,
        size: 64 << 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--role" => a.role = value()?,
            "--via" => a.via = value()?,
            "--nats-url" => a.nats_url = Some(value()?),
            "--etcd-url" => a.etcd_url = Some(value()?),
            "--size" => a.size = value()?.parse().context("--size takes bytes")?,
            other => bail!(
                "unknown argument {other}; use --via nats|http|etcd [--nats-url URL] \
                 [--etcd-url URL] [--size BYTES]"
            ),
        }
    }
    if !["nats", "http", "etcd"].contains(&a.via.as_str()) {
        bail!("--via takes nats, http or etcd, not {}", a.via);
    }
    Ok(a)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    match a.role.as_str() {
        "prefill" => prefill(a).await,
        "decode" => decode(a).await,
        r => bail!("--role takes prefill or decode, not {r}"),
    }
}

async fn listening_connector() -> anyhow::Result<Connector> {
    Ok(Connector::builder()
        .listen("127.0.0.1:0".parse()?)
        .build()
        .await?)
}

/// The exposing side: publish, say READY on stdout, wait for the reader.
async fn prefill(a: Args) -> anyhow::Result<()> {
    let connector = listening_connector().await?;
    let kv = connector
        .create_readable(vec![Descriptor::from_vec(pattern(a.size))])
        .await?;
    let (_publication, _server, _nats, where_) = if a.via == "http" {
        let server = HttpServer::bind("127.0.0.1:0").await?;
        let p = server.publish(KEY, kv.metadata())?;
        let addr = server.local_addr().to_string();
        (p, Some(server), None, addr)
    } else if a.via == "etcd" {
        let url = a
            .etcd_url
            .context("prefill through etcd needs --etcd-url")?;
        let etcd = EtcdStore::connect(&url, DEADLINE).await?;
        let p = etcd.publish(KEY, kv.metadata()).await?;
        (p, None, None, url)
    } else {
        let url = a.nats_url.context("prefill over NATS needs --nats-url")?;
        let nats = NatsChannel::connect(&url, DEADLINE).await?;
        let p = nats.publish(KEY, kv.metadata()).await?;
        (p, None, Some(nats), url)
    };
    println!("READY {where_}");
    kv.wait_for_completion_timeout(Duration::from_secs(60))
        .await
        .context("prefill: the decode worker did not read the KV cache")?;
    eprintln!("prefill: the decode worker has read the {} bytes", a.size);
    Ok(())
}

/// Kills a child process when dropped (the NATS server, the prefill worker
/// if decode fails early).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_nats() -> anyhow::Result<Option<(Reap, String)>> {
    if Command::new("nats-server")
        .arg("--version")
        .output()
        .is_err()
    {
        return Ok(None);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nats-server")?;
    // NatsChannel::connect waits (until its deadline) for it to listen.
    Ok(Some((Reap(child), format!("nats://127.0.0.1:{port}"))))
}

/// An etcd on free loopback ports with a temporary data directory
/// (removed when dropped), or `None` if etcd is not installed.
struct EtcdServer {
    process: Reap,
    dir: std::path::PathBuf,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.process.0.kill();
        let _ = self.process.0.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_etcd() -> anyhow::Result<Option<(EtcdServer, String)>> {
    if Command::new("etcd").arg("--version").output().is_err() {
        return Ok(None);
    }
    let port = || -> anyhow::Result<u16> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port())
    };
    let (client, peer) = (format!("http://127.0.0.1:{}", port()?), port()?);
    let peer = format!("http://127.0.0.1:{peer}");
    let dir = std::env::temp_dir().join(format!("ferry-example-etcd-{}", std::process::id()));
    let child = Command::new("etcd")
        .args(["--name", "example", "--data-dir"])
        .arg(&dir)
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("example={peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting etcd")?;
    // EtcdStore::connect waits (until its deadline) for it to answer.
    let server = EtcdServer {
        process: Reap(child),
        dir,
    };
    Ok(Some((server, client)))
}

/// The reading side: start prefill, fetch, read, check.
async fn decode(a: Args) -> anyhow::Result<()> {
    let mut _nats_server = None;
    let nats_url = match (&a.via[..], a.nats_url.clone()) {
        ("nats", Some(url)) => Some(url),
        ("nats", None) => {
            match start_nats()? {
                Some((server, url)) => {
                    _nats_server = Some(server);
                    Some(url)
                }
                None => {
                    println!("SKIPPED: nats-server is not installed (Debian: apt-get install nats-server)");
                    return Ok(());
                }
            }
        }
        _ => None,
    };
    let nats = match &nats_url {
        Some(url) => Some(NatsChannel::connect(url, DEADLINE).await?),
        None => None,
    };
    let mut _etcd_server = None;
    let etcd_url = match (&a.via[..], a.etcd_url.clone()) {
        ("etcd", Some(url)) => Some(url),
        ("etcd", None) => match start_etcd()? {
            Some((server, url)) => {
                _etcd_server = Some(server);
                Some(url)
            }
            None => {
                println!("SKIPPED: etcd is not installed (Debian: apt-get install etcd-server)");
                return Ok(());
            }
        },
        _ => None,
    };
    let etcd = match &etcd_url {
        Some(url) => Some(EtcdStore::connect(url, DEADLINE).await?),
        None => None,
    };
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([
        "--role",
        "prefill",
        "--via",
        &a.via,
        "--size",
        &a.size.to_string(),
    ]);
    if let Some(url) = &nats_url {
        cmd.args(["--nats-url", url]);
    }
    if let Some(url) = &etcd_url {
        cmd.args(["--etcd-url", url]);
    }
    let mut prefill = Reap(cmd.stdout(Stdio::piped()).spawn()?);
    let out = prefill.0.stdout.take().context("prefill's stdout")?;
    let where_ = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).map(|_| line)
    });
    let where_ = tokio::time::timeout(Duration::from_secs(30), where_)
        .await
        .context("the prefill worker did not start within 30 s")???;
    let where_ = where_
        .trim()
        .strip_prefix("READY ")
        .with_context(|| format!("prefill said {where_:?}"))?
        .to_owned();

    let connector = listening_connector().await?;
    let t = Instant::now();
    let remote = match (&nats, &etcd) {
        (Some(n), _) => n.fetch(KEY, DEADLINE).await?,
        (_, Some(e)) => e.fetch(KEY, DEADLINE).await?,
        _ => HttpClient::new(where_.clone()).fetch(KEY, DEADLINE).await?,
    };
    let handover = t.elapsed();
    let t = Instant::now();
    let read = connector
        .begin_read(&remote, vec![Descriptor::from_vec(vec![0; a.size])])
        .await?;
    read.wait_for_completion_timeout(Duration::from_secs(60))
        .await?;
    let took = t.elapsed();
    let transport = read.transport().map_or("?".into(), |t| t.to_string());
    let got = read.into_descriptors();
    if got[0].as_slice() != Some(&pattern(a.size)[..]) {
        bail!("decode: the bytes read differ from the prefill worker's");
    }
    let status = tokio::task::spawn_blocking(move || prefill.0.wait()).await??;
    if !status.success() {
        bail!("the prefill worker failed: {status}");
    }
    println!(
        "decode: metadata over {} ({where_}) in {} us; read {} MiB over {} in {:.1} ms ({:.2} GB/s); prefill saw it done",
        a.via,
        handover.as_micros(),
        a.size >> 20,
        transport,
        took.as_secs_f64() * 1e3,
        a.size as f64 / took.as_secs_f64() / 1e9,
    );
    Ok(())
}
