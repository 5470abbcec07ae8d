//! GPU memory for tests that cross a process boundary: `CudaBuffer`s where
//! there is a GPU, else simulated GPU memory (host allocations described
//! as `cuda:0`, for a process that called
//! `ferry::cuda::simulate_with_host_memory()`), and how to read either
//! back.
//!
//! Also the loop of a spawned server (`spawned.rs`) that serves a list of
//! operations over such memory in turn ([`serve_ops`]).
//!
//! Included by path (`#[path = "support/sim_memory.rs"] mod sim_memory;`)
//! by `staged.rs`, `gpu_path.rs` and `gpu_ucx.rs`, each of which also
//! includes `spawned.rs` as `spawned`.

// Not every test that includes this uses every helper.
#![allow(dead_code)]

use std::io::Write;
use std::time::Duration;

use ferry::cuda::CudaBuffer;
use ferry::{Connector, Descriptor};

use super::spawned::check;

/// Operations as a server's spec: `<R|W><G|H>,...` for each `(readable,
/// gpu)`.
pub fn ops_spec(ops: impl Iterator<Item = (bool, bool)>) -> String {
    let ops: Vec<String> = ops
        .map(|(readable, gpu)| {
            let kind = if readable { 'R' } else { 'W' };
            let mem = if gpu { 'G' } else { 'H' };
            format!("{kind}{mem}")
        })
        .collect();
    ops.join(",")
}

/// Serves the operations of `ops` ([`ops_spec`]) in turn on `c`: for
/// operation `i`, the descriptors `make(gpu, seed)` gives (a readable's
/// bytes seeded `seed0 + i`, which a writable must receive), prints `META
/// <json>`, waits up to `limit`, prints `DONE <status> <transport>`, the
/// lines `after(c)` gives, and for a writable `CHECK ok` or what differs;
/// then waits until its standard input closes.
pub async fn serve_ops(
    c: &Connector,
    ops: &str,
    seed0: u64,
    limit: Duration,
    make: impl Fn(bool, Option<u64>) -> (Vec<Descriptor<'static>>, Keep),
    after: impl Fn(&Connector) -> Vec<String>,
) {
    let out = std::io::stdout();
    let say = |s: String| {
        writeln!(out.lock(), "{s}").unwrap();
        out.lock().flush().unwrap();
    };
    for (i, op) in ops.split(',').enumerate() {
        let (readable, gpu) = (op.starts_with('R'), op.ends_with('G'));
        let seed = seed0 + i as u64;
        let (descs, keep) = make(gpu, readable.then_some(seed));
        let (status, transport, descs) = if readable {
            let r = c.create_readable(descs).await.unwrap();
            say(format!("META {}", r.metadata().to_json()));
            let _ = r.wait_for_completion_timeout(limit).await;
            (r.status(), r.transport(), r.into_descriptors())
        } else {
            let w = c.create_writable(descs).await.unwrap();
            say(format!("META {}", w.metadata().to_json()));
            let _ = w.wait_for_completion_timeout(limit).await;
            (w.status(), w.transport(), w.into_descriptors())
        };
        let t = transport.map_or("none", |t| t.name());
        say(format!("DONE {status:?} {t}"));
        for line in after(c) {
            say(line);
        }
        let got = keep.read_back(descs);
        if !readable {
            match check(&got, seed) {
                Ok(()) => say("CHECK ok".into()),
                Err(e) => say(format!("CHECK {e}")),
            }
        }
    }
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// The memory behind one side's simulated GPU descriptors: allocations
/// held by raw pointer (moving a `Keep` moves no borrow of them), freed
/// when it drops, after the operation gave its descriptors back. Only
/// [`Keep::descriptor`] adds to them.
#[derive(Default)]
pub struct Keep(Vec<(*mut u8, usize)>);

impl Keep {
    /// One descriptor per entry of `contents`: GPU memory where `gpu`
    /// ([`Keep::gpu_descriptor`]: a `CudaBuffer` where `real`, else
    /// simulated), else host vectors.
    pub fn descriptors(
        contents: Vec<Vec<u8>>,
        gpu: bool,
        real: bool,
    ) -> (Vec<Descriptor<'static>>, Keep) {
        let mut keep = Keep::default();
        let descs = contents
            .into_iter()
            .map(|bytes| {
                if gpu {
                    keep.gpu_descriptor(bytes, real)
                } else {
                    Descriptor::from_vec(bytes)
                }
            })
            .collect();
        (descs, keep)
    }

    /// A `cuda:0` descriptor holding `bytes`: a `CudaBuffer` where `real`
    /// (a GPU here), else simulated GPU memory kept by `self`.
    pub fn gpu_descriptor(&mut self, bytes: Vec<u8>, real: bool) -> Descriptor<'static> {
        if !real {
            return self.descriptor(bytes);
        }
        let mut b = CudaBuffer::new(0, bytes.len()).expect("GPU memory");
        b.copy_from_host(&bytes).expect("a copy to the GPU");
        b.into_descriptor()
    }

    /// The bytes of every descriptor, once the operation gave them back:
    /// host memory, a `CudaBuffer` (copied to the host), or simulated GPU
    /// memory of `self`, in order.
    pub fn read_back(&self, descs: Vec<Descriptor<'static>>) -> Vec<Vec<u8>> {
        let mut sim = 0..self.0.len();
        descs
            .into_iter()
            .map(|d| {
                if let Some(s) = d.as_slice() {
                    return s.to_vec();
                }
                match d.into_owner::<CudaBuffer>() {
                    Ok(b) => {
                        let mut out = vec![0u8; b.len()];
                        b.copy_to_host(&mut out).expect("a copy from the GPU");
                        out
                    }
                    Err(_) => self.bytes(sim.next().expect("simulated memory")),
                }
            })
            .collect()
    }

    /// The address of simulated allocation `i`.
    pub fn address(&self, i: usize) -> u64 {
        self.0[i].0 as u64
    }

    /// Whether `self` holds no simulated GPU memory.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A `cuda:0` descriptor over a new allocation holding `bytes`, kept
    /// (and freed) by `self`. The process must simulate a GPU.
    pub fn descriptor(&mut self, bytes: Vec<u8>) -> Descriptor<'static> {
        let len = bytes.len();
        let ptr = Box::into_raw(bytes.into_boxed_slice()).cast::<u8>();
        self.0.push((ptr, len));
        // SAFETY: simulated device memory is host memory: this allocation,
        // which `self` frees only when it drops, after the operation has
        // given the descriptor back (the callers' order).
        unsafe { Descriptor::from_cuda_ptr(ptr as u64, len, 0, true) }
    }

    /// The bytes of allocation `i` now.
    pub fn bytes(&self, i: usize) -> Vec<u8> {
        let (p, n) = self.0[i];
        // SAFETY: an allocation of `n` bytes made by `descriptor`, alive
        // until `self` drops; read only once its operation gave it back.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    }
}

impl Drop for Keep {
    fn drop(&mut self) {
        for &(p, n) in &self.0 {
            // SAFETY: made by `Box::into_raw` of a boxed slice of `n`
            // bytes in `descriptor` (the only way in: the field is
            // private), freed once, here.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) });
        }
    }
}
