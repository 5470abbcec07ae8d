//! The device sweep (`ferry bench --device cuda:N`, or `sim`): GPU memory
//! on both sides, moved by Ferry over TCP (staged through host memory on
//! each side), against Ferry over TCP with host memory, slice by slice in
//! turns; and the device's own copies of the same size (`cuMemcpyDtoH`
//! and `cuMemcpyHtoD` through a `CudaBuffer`; with `sim`, `memcpy`), so
//! that the staging's cost can be read against both.
//!
//! The staged row's ratio is to Ferry's host TCP row of the same run (the
//! issue's figure: at least 0.8). With `sim` the device's copies are
//! `memcpy`s, so the figure is the staging path's cost less the PCIe
//! copies: a floor for what a GPU would show, not that figure.
//!
//! On a real GPU each shape also gets the CUDA IPC rows: READ and WRITE
//! with device memory on both sides through the cross-memory attach
//! connector (the target's memory lent by CUDA IPC and copied on the
//! device), against `cuMemcpyDtoD` between two buffers of this process
//! (the figure: at least 0.8 at 1 GiB), end to end and, in a
//! `transfer` row, their transfer phase alone (from `begin_read` or
//! `begin_write` to the later completion: without creating the passive
//! side and handing its metadata over). `sim` has none: a
//! simulated GPU lends nothing. Where both processes' UCX moves CUDA
//! memory (`FERRY_UCX_CUDA=1` and a UCX built with CUDA), the UCX lane's
//! READ and WRITE of device memory get rows against the same baseline.

use std::hint::black_box;

use super::rows::{Samples, ROUNDS};
use super::{Bench, Lane, Row};

impl Bench {
    /// The whole device sweep: per shape, the device's copies, then READ
    /// and WRITE staged against host memory; printed as a table.
    pub(super) async fn device_sweep(&mut self) -> anyhow::Result<()> {
        let dev = self.opts.device.clone().unwrap_or_default();
        // One staged operation first: a refusal (no CUDA here or there)
        // says why before anything is measured.
        let (_, _, used) = self.one(Lane::Staged, "read", 4096, 1).await?;
        eprintln!(
            "device sweep on {dev}: GPU memory on both sides moves over {}, staged through \
             host memory",
            used.map_or("?", |t| t.name())
        );
        let shapes: Vec<(u64, usize)> = self
            .opts
            .blocks
            .iter()
            .flat_map(|&bl| self.opts.batches.iter().map(move |&ba| (bl, ba)))
            .filter(|&(bl, ba)| bl * ba as u64 <= self.opts.max_op_bytes)
            .collect();
        for (i, &(block, batch)) in shapes.iter().enumerate() {
            eprint!(
                "\r[{:>3}/{}] {:>7} x{batch:<3}",
                i + 1,
                shapes.len(),
                super::human(block)
            );
            for r in self.device_copy_rows(block, batch)? {
                self.emit(r)?;
            }
            for op in ["read", "write"] {
                for r in self.device_pair(op, block, batch).await? {
                    self.emit(r)?;
                }
            }
            if dev != "sim" {
                for r in self.ipc_rows(block, batch).await? {
                    self.emit(r)?;
                }
            }
        }
        eprintln!("\r{:<60}", "device sweep done");
        super::print_table(&self.rows);
        println!("{}", super::buffers_line());
        if dev == "sim" {
            println!(
                "device sim: host memory stood in for the GPU on both sides, its copies are \
                 memcpy: the staged rows show the staging path's cost without PCIe, not a GPU's \
                 figure; no CUDA IPC rows (a simulated GPU lends nothing)"
            );
        }
        Ok(())
    }

    /// The host TCP row and the staged row for one shape, taking turns.
    pub(super) async fn device_pair(
        &mut self,
        op: &str,
        block: u64,
        batch: usize,
    ) -> anyhow::Result<Vec<Row>> {
        let sl = self.slice(block * batch as u64);
        let (mut host, mut staged) = <(Samples, Samples)>::default();
        let mut used = None;
        for _ in 0..ROUNDS {
            host.add(self.ferry_slice(Lane::Tcp, op, block, batch, sl).await?.0);
            let (s, t) = self.ferry_slice(Lane::Staged, op, block, batch, sl).await?;
            staged.add(s);
            used = used.or(t);
        }
        let base = host.into_row("ferry", "tcp", op, block, batch);
        let dev = self.opts.device.clone().unwrap_or_default();
        let used = used.map(|t| t.name()).unwrap_or("?");
        let mut r = staged.into_row(&format!("ferry {dev}"), used, op, block, batch);
        r.baseline = Some(format!("ferry tcp {op} (host memory)"));
        r.ratio = Some(r.gbps / base.gbps.max(1e-12));
        Ok(vec![base, r])
    }

    /// `cuMemcpyDtoD` of one operation's bytes within this process, then
    /// READ and WRITE with device memory on both sides through the
    /// cross-memory attach connector (CUDA IPC), and through the UCX lane
    /// where both processes' UCX moves CUDA memory
    /// (`ferry::ucx::moves_cuda`), each against it.
    pub(super) async fn ipc_rows(&mut self, block: u64, batch: usize) -> anyhow::Result<Vec<Row>> {
        let bytes = (block * batch as u64) as usize;
        let device = self.opts.device.clone().unwrap_or_default();
        let d = crate::buffers::device_of(&device)?;
        let dtod = {
            let src = ferry::cuda::CudaBuffer::new(d.id(), bytes)?;
            let mut dst = ferry::cuda::CudaBuffer::new(d.id(), bytes)?;
            self.timed("cuMemcpyDtoD", "copy", block, batch, || {
                dst.copy_from(&src).map_err(Into::into)
            })?
        };
        let mut rows = vec![dtod.clone()];
        let mut lanes = vec![(Lane::Ipc, ferry::TransportKind::CudaIpc)];
        if self.ucx.is_some() && ferry::ucx::moves_cuda() {
            lanes.push((Lane::UcxDevice, ferry::TransportKind::Ucx));
        }
        let sl = self.slice(block * batch as u64);
        'lanes: for (lane, want) in lanes {
            for op in ["read", "write"] {
                let mut samples = Samples::default();
                let mut used = None;
                for _ in 0..ROUNDS {
                    let (s, t) = match self.ferry_slice(lane, op, block, batch, sl).await {
                        Ok(r) => r,
                        // The UCX lane is an addition: its failure costs
                        // its own rows, not the CUDA IPC ones.
                        Err(e) if lane == Lane::UcxDevice => {
                            eprintln!(
                                "\nUCX with device memory, {op} {}: {e:#}",
                                super::human(block)
                            );
                            continue 'lanes;
                        }
                        Err(e) => return Err(e),
                    };
                    samples.add(s);
                    used = used.or(t);
                }
                let as_meant = used == Some(want);
                let used = used.map(|t| t.name()).unwrap_or("?");
                // The transfer phase alone too: the end-to-end row also
                // counts creating the passive side and handing its
                // metadata over, a fixed cost a copy of a GiB on one GPU
                // (under a millisecond) does not hide.
                let mut phase = samples.transfer_row(
                    &format!("ferry {device} transfer"),
                    used,
                    op,
                    block,
                    batch,
                );
                let mut r = samples.into_row(&format!("ferry {device}"), used, op, block, batch);
                if as_meant {
                    for x in [&mut r, &mut phase] {
                        x.baseline = Some("cuMemcpyDtoD (one process)".into());
                        x.ratio = Some(x.gbps / dtod.gbps.max(1e-12));
                    }
                    rows.extend([r, phase]);
                } else {
                    // Not the path the baseline is for: no ratio to it.
                    eprintln!(
                        "\n{op} {}: moved by {used}, not {}",
                        super::human(block),
                        want.name()
                    );
                    rows.push(r);
                }
            }
        }
        Ok(rows)
    }

    /// The device's copies of one operation's bytes, each way:
    /// `cuMemcpyDtoH` and `cuMemcpyHtoD` (synchronous, pageable host
    /// memory, as the staging path copies), or `memcpy` with `sim`.
    pub(super) fn device_copy_rows(&self, block: u64, batch: usize) -> anyhow::Result<Vec<Row>> {
        let bytes = (block * batch as u64) as usize;
        let device = self.opts.device.clone().unwrap_or_default();
        let mut host = vec![1u8; bytes];
        let mut rows = Vec::new();
        if device == "sim" {
            let src = crate::buffers::host_buffer(bytes)?;
            let s = src.as_slice().unwrap_or_default();
            let r = self.timed("memcpy (sim)", "copy", block, batch, || {
                host.copy_from_slice(black_box(s));
                black_box(&mut host);
                Ok(())
            })?;
            rows.push(r);
            return Ok(rows);
        }
        let d = crate::buffers::device_of(&device)?;
        let mut buf = ferry::cuda::CudaBuffer::new(d.id(), bytes)?;
        buf.copy_from_host(&host)?;
        rows.push(self.timed("cuMemcpyDtoH", "copy", block, batch, || {
            buf.copy_to_host(&mut host).map_err(Into::into)
        })?);
        let src = host.clone();
        rows.push(self.timed("cuMemcpyHtoD", "copy", block, batch, || {
            buf.copy_from_host(&src).map_err(Into::into)
        })?);
        Ok(rows)
    }
}
