//! The `ucx` rows of `ferry bench`: Ferry over UCX (a connector restricted
//! to UCX and TCP on both sides, every size by UCX) next to the raw UCX
//! baseline (`ucx_get`): `ucp_get_nbx` of the operation's bytes between the
//! same two processes, one get at a time, each posted and then waited for
//! by polling the worker, no Ferry protocol. The destination gets, as
//! Ferry's does: this process for READ, the target for WRITE.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail};
use ferry::ucx::baseline::{Lent, Node};
use ferry::{Connector, TransportKind};

use super::rows::{Samples, Slice};
use super::{builder, human, Bench, Lane, Options, Row};
use crate::peer::{self, Cmd, Request};

/// Registrations timed per buffer (the median is reported).
const REG_SAMPLES: usize = 5;

/// This process's side of the UCX rows.
pub(super) struct Side {
    /// Restricted to UCX and TCP, every size by UCX.
    pub(super) connector: Connector,
    /// The raw baseline's workers: one lends (WRITE), one gets (READ).
    lender: Node,
    getter: Node,
    /// The lanes of the raw baseline's endpoint to the target.
    lanes: Vec<String>,
}

impl Side {
    /// The UCX lane listening on `listen`, or `None` after one printed line
    /// saying why there is none.
    pub(super) async fn start(opts: &Options, listen: SocketAddr) -> Option<Side> {
        let made = async {
            ferry::ucx::status()?;
            let connector = peer::ucx_lane(builder(opts))
                .listen(listen)
                .build()
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(Side {
                connector,
                lender: Node::start()?,
                getter: Node::start()?,
                lanes: Vec::new(),
            })
        };
        match made.await {
            Ok(s) => Some(s),
            Err(why) => {
                eprintln!("ucx rows skipped: no UCX in this process ({why})");
                None
            }
        }
    }
}

impl Bench {
    /// Whether the UCX rows can run: one READ and one WRITE of 4 KiB over
    /// the UCX lane, both carried by UCX (else one printed line says why).
    pub(super) async fn ucx_probe(&mut self) -> bool {
        if self.ucx.is_none() {
            return false;
        }
        let mut why = String::new();
        for op in ["read", "write"] {
            match self.one(Lane::Ucx, op, 4096, 1).await {
                Ok((_, _, Some(TransportKind::Ucx))) => {}
                Ok((_, _, t)) => why = format!("a {op} went by {t:?}, not by UCX"),
                Err(e) => why = format!("{e:#}"),
            }
        }
        if why.is_empty() {
            return true;
        }
        eprintln!("ucx rows skipped: the target cannot run them ({why})");
        self.ucx = None;
        false
    }

    /// One slice of the raw UCX row: `ucp_get_nbx` of block x batch bytes
    /// (one buffer, registered by the other process), by the destination,
    /// timed get by get; the first get of a slice warms up and is not
    /// counted. Also the registration times of the buffer (nanoseconds).
    pub(super) async fn ucx_slice(
        &mut self,
        op: &str,
        block: u64,
        batch: usize,
        sl: Slice,
    ) -> anyhow::Result<(Samples, Vec<u64>)> {
        let bytes = block * batch as u64;
        let iters = sl.unclocked(bytes);
        let side = self.ucx.as_mut().ok_or_else(|| anyhow!("no UCX lane"))?;
        let (lat, reg) = if op == "read" {
            let mut r = Request::new(0, Cmd::UcxLend);
            r.sizes = vec![bytes];
            r.count = Some(REG_SAMPLES);
            let lent = self.peer.request(r).await?.expect("lent").await?;
            if let Some(e) = lent.error {
                bail!("the target cannot lend over UCX: {e}");
            }
            let offer = lent.ucx.unwrap_or_default();
            let g = side.getter.connect(&offer).map_err(anyhow::Error::msg)?;
            side.lanes = g.lanes();
            let lat = peer::ucx::timed(g, iters + 1).await;
            let lat = lat.map_err(|e| anyhow!("raw UCX get from the target: {e}"))?;
            (lat, lent.lat_ns.unwrap_or_default())
        } else {
            let lent = Lent::new(bytes as usize, REG_SAMPLES).map_err(anyhow::Error::msg)?;
            let mut r = Request::new(0, Cmd::UcxPull);
            r.ucx = Some(lent.offer(&side.lender));
            r.count = Some(iters + 1);
            let done = self.peer.request(r).await?.expect("done").await?;
            let reg = lent.registrations().iter().map(|d| d.as_nanos() as u64);
            let reg = reg.collect();
            drop(lent);
            if let Some(e) = done.error {
                bail!("the target could not get from this process over UCX: {e}");
            }
            let lat = done.lat_ns.unwrap_or_default();
            (lat.into_iter().map(Duration::from_nanos).collect(), reg)
        };
        let lat: Vec<Duration> = lat.into_iter().skip(1).collect();
        if lat.is_empty() {
            bail!("no raw UCX get measured");
        }
        let wall = lat.iter().sum();
        Ok((
            Samples {
                lat,
                wall,
                ..Samples::default()
            },
            reg,
        ))
    }
}

/// What UCX ran over (the raw baseline's endpoint lanes) and the
/// registration time per size of the `ucx_get` READ rows (buffers the
/// target registered), one line each.
pub(super) fn print_lines(side: Option<&Side>, rows: &[Row]) {
    if let Some(s) = side.filter(|s| !s.lanes.is_empty()) {
        let how = if s.lanes.iter().any(|l| l.contains("rma")) {
            "gets by an rma lane"
        } else {
            "no rma lane: gets travel as active messages"
        };
        println!("ucx endpoint lanes: {} ({how})", s.lanes.join(", "));
    }
    let mut seen = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.kind == "ucx_get" && r.op == "read")
    {
        let bytes = r.block_size * r.batch as u64;
        if let (Some(us), false) = (r.reg_us, seen.iter().any(|s: &(u64, f64)| s.0 == bytes)) {
            seen.push((bytes, us));
        }
    }
    if seen.is_empty() {
        return;
    }
    let sizes: Vec<String> = seen
        .iter()
        .map(|(b, us)| format!("{} {us:.1} us", human(*b)))
        .collect();
    println!(
        "ucx registration (ucp_mem_map + ucp_rkey_pack of the lent buffer, median of {REG_SAMPLES}, in the target): {}",
        sizes.join(", ")
    );
}
