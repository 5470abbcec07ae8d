//! Simulated GPU memory for tests that cross a process boundary: host
//! allocations described as `cuda:0`, for a process that called
//! `ferry::cuda::simulate_with_host_memory()`.
//!
//! Included by path (`#[path = "support/sim_memory.rs"] mod sim_memory;`)
//! by `staged.rs`, `gpu_path.rs` and `gpu_ucx.rs`.

// Not every test that includes this uses every helper.
#![allow(dead_code)]

use ferry::Descriptor;

/// The memory behind one side's simulated GPU descriptors: allocations
/// held by raw pointer (moving a `Keep` moves no borrow of them), freed
/// when it drops, after the operation gave its descriptors back.
#[derive(Default)]
pub struct Keep(pub Vec<(*mut u8, usize)>);

impl Keep {
    /// One descriptor per entry of `contents`: simulated GPU memory, kept
    /// by the returned `Keep`, where `gpu`; else host vectors.
    pub fn descriptors(contents: Vec<Vec<u8>>, gpu: bool) -> (Vec<Descriptor<'static>>, Keep) {
        let mut keep = Keep::default();
        let descs = contents
            .into_iter()
            .map(|bytes| {
                if gpu {
                    keep.descriptor(bytes)
                } else {
                    Descriptor::from_vec(bytes)
                }
            })
            .collect();
        (descs, keep)
    }

    /// The bytes of every descriptor (host memory, or simulated GPU memory
    /// of `self` in order), once the operation gave them back.
    pub fn read_back(&self, descs: Vec<Descriptor<'static>>) -> Vec<Vec<u8>> {
        let mut sim = 0..self.0.len();
        descs
            .into_iter()
            .map(|d| match d.as_slice() {
                Some(s) => s.to_vec(),
                None => self.bytes(sim.next().expect("simulated memory")),
            })
            .collect()
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
            // bytes in `descriptor`, freed once, here.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) });
        }
    }
}
