//! `RdmaMetadata::from_json_bytes` over arbitrary bytes: never panics, and
//! whatever it accepts obeys every limit (transport blobs included) and
//! survives a round trip.
#![no_main]

use ferry_proto::{RdmaMetadata, MAX_ADDRESSES, MAX_DESCRIPTORS, MAX_METADATA_JSON};
use libfuzzer_sys::fuzz_target;

/// `metadata::MAX_DESCRIPTOR_SIZE` and `MAX_TOTAL_SIZE` (not exported).
const MAX_DESCRIPTOR_SIZE: u64 = 1 << 40;
const MAX_TOTAL_SIZE: u64 = 1 << 48;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = RdmaMetadata::from_json_bytes(data) else {
        return;
    };
    assert!(data.len() <= MAX_METADATA_JSON);
    let n = m.descriptor_count();
    assert!((1..=MAX_DESCRIPTORS).contains(&n), "{n} descriptors");
    assert!(m.descriptors().iter().all(|d| d.count >= 1));
    assert_eq!(m.sizes().len(), n);
    assert!(m
        .descriptors()
        .iter()
        .all(|d| d.size <= MAX_DESCRIPTOR_SIZE));
    assert!(m.total_size() <= MAX_TOTAL_SIZE);
    assert!((1..=MAX_ADDRESSES).contains(&m.addresses().len()));
    for s in [m.worker_id(), m.hostname(), m.host_id()] {
        assert!((1..=256).contains(&s.len()));
    }
    assert!(m.transport_blobs().count() <= RdmaMetadata::MAX_TRANSPORTS);
    for (name, blob) in m.transport_blobs() {
        let b = name.as_bytes();
        assert!((1..=RdmaMetadata::MAX_TRANSPORT_NAME).contains(&b.len()));
        assert!(b[0].is_ascii_lowercase(), "transport name {name:?}");
        assert!(
            b.iter()
                .all(|&c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-')),
            "transport name {name:?}"
        );
        assert!(blob.len() <= RdmaMetadata::MAX_TRANSPORT_BLOB);
        assert_eq!(m.transport_blob(name), Some(blob));
    }
    let json = m.to_json();
    let back = RdmaMetadata::from_json(&json).expect("accepted metadata re-parses");
    assert_eq!(back, m);
    assert_eq!(back.to_json(), json, "serialization is canonical");
    // The Debug form never carries the token.
    let hex: String = m
        .token()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(!format!("{m:?}").contains(&hex));
});
