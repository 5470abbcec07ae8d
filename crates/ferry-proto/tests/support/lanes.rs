//! The lanes a test session shares with its peer: a host lane (as
//! cross-memory attach declares itself) and a device lane riding on its
//! proof (as CUDA IPC does), device memory only where `device`.

use ferry_proto::lane::{FailureScope, LaneCaps, LaneId, LaneSet, MemKinds, Proven, Reach};

pub fn agreed(device: bool) -> LaneSet {
    let host = LaneCaps {
        id: LaneId::CMA,
        lends: MemKinds::HOST,
        pulls_into: MemKinds::HOST,
        reach: Reach::Host,
        within_process: true,
        failure: FailureScope::Connection,
        proven_by: LaneId::CMA,
    };
    let gpu = LaneCaps {
        id: LaneId::CUDA_IPC,
        lends: MemKinds::DEVICE,
        pulls_into: MemKinds::BOTH,
        within_process: false,
        failure: FailureScope::Request,
        ..host
    };
    let proven = Proven {
        proved_by: Some(LaneId::CMA),
        device,
        same_process: false,
    };
    LaneSet::agreed(&[host, gpu], &proven)
}
