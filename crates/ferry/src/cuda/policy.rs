//! Which operations over GPU memory a connector accepts, checked before
//! anything starts, so that a pairing no transport carries is a typed
//! error rather than a hang or a copy that fails half-way.
//!
//! GPU memory moves by CUDA IPC between two processes of one host where the
//! source is on a GPU (into GPU or host memory), and in band everywhere
//! else, each side staging its own GPU memory through host memory (TCP:
//! another host, no attach, host memory into GPU memory, a connection to
//! itself; see `transport/tcp/staged.rs`). So every pairing moves, and what
//! is left to refuse is an operation whose descriptors mix host memory and
//! GPU memory, or two GPUs (one operation is one memory).
use ferry_proto::Device;

use crate::descriptor::Descriptor;
use crate::error::{Error, Result};

/// The device of an operation's memory: `None` for host memory, else the
/// one GPU all its descriptors are on; refused where they are mixed.
pub(crate) fn one_memory(descs: &[Descriptor<'_>]) -> Result<Option<Device>> {
    let first = descs.first().map(|d| d.device());
    for (index, d) in descs.iter().enumerate() {
        if Some(d.device()) != first {
            return Err(Error::NoDeviceTransport {
                index,
                device: d.device(),
                reason: format!(
                    "descriptor 0 is on {}: one operation's descriptors must all be host \
                     memory or all on one GPU",
                    first.map_or_else(String::new, |f| f.to_string())
                ),
            });
        }
    }
    Ok(first.filter(|d| !d.is_cpu()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::DeviceKind;

    /// Made-up device addresses, never dereferenced (only their device is
    /// read).
    fn on(device: Device) -> Descriptor<'static> {
        match device.kind() {
            DeviceKind::Cpu => Descriptor::from_vec(vec![0; 64]),
            // SAFETY: never dereferenced: the policy reads the device only.
            _ => unsafe { Descriptor::from_cuda_ptr(0x7f00_0000_0000, 64, device.id(), true) },
        }
    }

    #[test]
    fn an_operation_moves_in_band_or_one_gpu() {
        let cpu = Device::CPU;
        let (g0, g1) = (Device::cuda(0), Device::cuda(1));
        assert_eq!(one_memory(&[on(cpu), on(cpu)]).unwrap(), None);
        assert_eq!(one_memory(&[on(g1), on(g1)]).unwrap(), Some(g1));
        for mixed in [
            vec![on(cpu), on(g0)],
            vec![on(g0), on(cpu)],
            vec![on(g0), on(g1)],
        ] {
            match one_memory(&mixed) {
                Err(Error::NoDeviceTransport {
                    index: 1, reason, ..
                }) => {
                    assert!(reason.contains("all on one GPU"), "{reason}")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
