//! The physical baseline of the KV shapes on one host: raw
//! `process_vm_readv`, one thread, no protocol, this process copying the
//! target's blocks (a READ's direction; a WRITE's copy is the same system
//! call made by the other process).
//!
//! Two rows per shape: `<shape>/raw-contiguous` copies all its bytes in
//! 2 MiB calls, as one plain buffer; `<shape>/raw-blocks` copies the same
//! shuffled block lists as the paged rows, one range per block on each side
//! and, like Ferry's runs of small blocks, at most 2 MiB and 1023 ranges per
//! call. Their ratio is what the kernel itself loses to scattered blocks:
//! the ceiling for a paged operation's "vs contig" on one thread.

use std::time::Instant;

use anyhow::anyhow;
use ferry::cross_memory::{copy_ranges_from_process, CHUNK};

use super::{block_ok, ids, median, KvRow, Shape, LOCAL};

/// The most ranges per call on either side (one fewer than `IOV_MAX`, as
/// Ferry's pulls).
const MAX_RANGES: usize = 1023;

/// Where the target's plain buffer of a shape lies: block `k` at
/// `base + k * block`, filled as [`super::fill_block`] fills id `k`.
pub(super) struct Source {
    pub(super) pid: u32,
    pub(super) base: u64,
}

impl Source {
    /// Parses the target's answer, `"<pid> <address>"`.
    pub(super) fn parse(s: &str) -> anyhow::Result<Source> {
        let mut it = s.split_whitespace();
        let (Some(pid), Some(base), None) = (it.next(), it.next(), it.next()) else {
            return Err(anyhow!("a raw source is `<pid> <address>`, not {s:?}"));
        };
        Ok(Source {
            pid: pid.parse()?,
            base: base.parse()?,
        })
    }
}

/// The two raw rows of shape `s`, `rounds` copies each (the first checks
/// every block of `raw-blocks`).
pub(super) fn measure(src: &Source, s: &Shape, rounds: usize) -> anyhow::Result<[KvRow; 2]> {
    let n = s.blocks as usize;
    let bytes = s.block * n;
    let mut buf = crate::buffers::host_buffer(bytes)?;
    let local = buf
        .as_mut_slice()
        .ok_or_else(|| anyhow!("the baseline's buffer is not host memory"))?;
    let mut walls = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        crate::peer::copy_in_chunks(src.pid, src.base, local)?;
        walls.push(t.elapsed().as_secs_f64());
    }
    let contiguous = row(s, "raw-contiguous", median(&mut walls), None);
    let mut walls = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let seed = 0x5eed + round as u64;
        let theirs = ids(s.blocks, s.run, seed);
        let mine = ids(s.blocks, s.run, seed ^ LOCAL);
        // One slice per block of ours, taken in the order of `mine`.
        let mut slots: Vec<Option<&mut [u8]>> = local.chunks_exact_mut(s.block).map(Some).collect();
        let mut order: Vec<&mut [u8]> = Vec::with_capacity(n);
        for &id in &mine {
            let slot = slots
                .get_mut(id as usize)
                .and_then(Option::take)
                .ok_or_else(|| anyhow!("block {id} twice in a permutation"))?;
            order.push(slot);
        }
        let per = (CHUNK / s.block).clamp(1, MAX_RANGES);
        let t = Instant::now();
        for (dst, ids) in order.chunks_mut(per).zip(theirs.chunks(per)) {
            let remote = ids
                .iter()
                .map(|&id| {
                    let at = (id as u64)
                        .checked_mul(s.block as u64)
                        .and_then(|o| src.base.checked_add(o))
                        .ok_or_else(|| anyhow!("block {id} lies past the address space"))?;
                    Ok((at, s.block as u64))
                })
                .collect::<anyhow::Result<Vec<(u64, u64)>>>()?;
            copy_ranges_from_process(src.pid, &remote, dst)?;
        }
        walls.push(t.elapsed().as_secs_f64());
        if round == 0 {
            for (k, (&m, &t)) in mine.iter().zip(&theirs).enumerate() {
                let at = m as usize * s.block;
                if !block_ok(&local[at..at + s.block], t) {
                    return Err(anyhow!("raw baseline: block {k} ({t} into {m}) differs"));
                }
            }
        }
    }
    let wall = median(&mut walls);
    let blocks = row(s, "raw-blocks", wall, Some(contiguous.gbps));
    Ok([contiguous, blocks])
}

fn row(s: &Shape, kind: &str, wall: f64, contiguous_gbps: Option<f64>) -> KvRow {
    let n = s.blocks as usize;
    let gbps = (s.block * n) as f64 / wall / 1e9;
    KvRow {
        shape: format!("{}/{kind}", s.name),
        transport: "cma".into(),
        op: "read",
        inflight: 1,
        blocks: s.blocks,
        block: s.block,
        gbps,
        blocks_per_s: n as f64 / wall,
        metadata_bytes: 0,
        create_us: 0.0,
        lat_us_p50: wall * 1e6,
        ratio: contiguous_gbps.map(|c| gbps / c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_a_pid_and_an_address() {
        let s = Source::parse("42 140737488355328").unwrap();
        assert_eq!((s.pid, s.base), (42, 140_737_488_355_328));
        for bad in ["", "42", "42 x", "42 1 2", "-1 5"] {
            assert!(Source::parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
