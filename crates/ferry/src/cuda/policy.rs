//! Which operations over GPU memory a connector accepts, checked before
//! anything starts, so that a pairing no transport carries is a typed
//! error rather than a hang or a copy that fails half-way.
//!
//! Device memory moves only by CUDA IPC, between two processes of one host,
//! from GPU memory into GPU memory or into host memory. So:
//!
//! - one operation's descriptors are all host memory or all on one GPU;
//! - where either side's memory is on a GPU, the two workers are on one
//!   host (the same `host_id` in the metadata) and this side has CUDA;
//! - the destination is on a GPU only if the source is (host memory into
//!   GPU memory is not moved in this version).
//!
//! The TCP driver then refuses a connection without cross-memory attach
//! (another host after all, attach disabled or refused), and the local
//! transport a remote in this same process.

use ferry_proto::{Device, DeviceKind, OperationKind, RdmaMetadata};

use super::{available, status};
use crate::{Descriptor, Error, Result};

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

/// Checks an active operation of `kind` whose local memory is on `local`
/// (`None`: host memory) against the remote's descriptors; `same_host`:
/// the remote's `host_id` is this connector's.
pub(crate) fn check_pair(
    kind: OperationKind,
    local: Option<Device>,
    remote: &RdmaMetadata,
    same_host: bool,
) -> Result<()> {
    let mut theirs = None;
    for (index, r) in remote.descriptors().iter().enumerate() {
        if r.device.kind() == DeviceKind::Cuda {
            theirs.get_or_insert((index, r.device));
        }
    }
    let (index, device) = match (local, theirs) {
        (None, None) => return Ok(()),
        (Some(d), _) => (0, d),
        (None, Some(t)) => t,
    };
    let refuse = |reason: &str| {
        Err(Error::NoDeviceTransport {
            index,
            device,
            reason: reason.to_string(),
        })
    };
    if !same_host {
        return refuse(
            "the remote is on another host, and GPU memory moves only by CUDA IPC between \
             processes of one host in this version",
        );
    }
    if local.is_none() && !available() {
        // The remote's GPU memory comes here by CUDA IPC, which needs the
        // driver on this side too.
        return Err(Error::CudaUnavailable {
            index,
            device,
            reason: status()
                .err()
                .unwrap_or_else(|| "the CUDA driver sees no device".into()),
        });
    }
    let (source_on_gpu, dest_on_gpu) = match kind {
        OperationKind::Read => (theirs.is_some(), local.is_some()),
        OperationKind::Write => (local.is_some(), theirs.is_some()),
    };
    if dest_on_gpu && !source_on_gpu {
        return refuse(
            "host memory into GPU memory does not move in this version (GPU to GPU and GPU to \
             host do, by CUDA IPC): describe the destination in host memory, or put the \
             source on the GPU",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::{DescriptorInfo, Token};

    fn remote(kind: OperationKind, devices: &[Device]) -> RdmaMetadata {
        RdmaMetadata::new(
            kind,
            "w".into(),
            "h".into(),
            "host".into(),
            vec!["127.0.0.1:1".parse().unwrap()],
            1,
            Token::from_bytes([1; 16]),
            devices
                .iter()
                .map(|&d| DescriptorInfo::run(d, 64, 1))
                .collect(),
        )
        .unwrap()
    }

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
    fn an_operation_is_host_memory_or_one_gpu() {
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

    #[test]
    fn pairings_that_no_transport_carries_are_refused() {
        use OperationKind::{Read, Write};
        let (cpu, gpu) = (Device::CPU, Device::cuda(0));
        // Host memory on both sides: nothing to check.
        assert!(check_pair(Read, None, &remote(Read, &[cpu]), false).is_ok());
        // Another host.
        for (kind, local, theirs) in [
            (Read, Some(gpu), cpu),
            (Read, None, gpu),
            (Write, Some(gpu), gpu),
        ] {
            match check_pair(kind, local, &remote(kind, &[cpu, theirs]), false) {
                Err(Error::NoDeviceTransport { reason, .. }) => {
                    assert!(reason.contains("another host"), "{reason}")
                }
                other => panic!("{kind:?} {local:?} {theirs:?}: {other:?}"),
            }
        }
        // Host memory into GPU memory, on one host.
        for (kind, local, theirs) in [(Read, Some(gpu), cpu), (Write, None, gpu)] {
            let r = check_pair(kind, local, &remote(kind, &[theirs]), true);
            match (r, available()) {
                (Err(Error::NoDeviceTransport { reason, .. }), _) => {
                    assert!(reason.contains("host memory into GPU memory"), "{reason}")
                }
                // A remote GPU and no CUDA here: that first.
                (Err(Error::CudaUnavailable { .. }), false) if local.is_none() => {}
                (other, _) => panic!("{kind:?} {local:?} {theirs:?}: {other:?}"),
            }
        }
        // GPU to GPU, GPU to host: accepted (with CUDA here for a remote
        // GPU).
        assert!(check_pair(Read, Some(gpu), &remote(Read, &[gpu]), true).is_ok());
        assert!(check_pair(Write, Some(gpu), &remote(Write, &[cpu]), true).is_ok());
        let r = check_pair(Read, None, &remote(Read, &[gpu]), true);
        assert_eq!(r.is_ok(), available(), "{r:?}");
    }
}
