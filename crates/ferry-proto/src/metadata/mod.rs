use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::runs::MAX_RUNS;
use crate::{Device, OperationKind};

mod error;
mod token;
mod transports;

pub use error::MetadataError;
pub use token::Token;
use transports::{
    check_transport_blob, check_transport_name, hex_decode, hex_encode, RawTransports,
};

/// The metadata format this build writes and reads.
pub const METADATA_VERSION: u32 = 1;
/// The most descriptors one operation may have, counting each block of a
/// paged descriptor as one (262,144 pieces of 2 KiB are an SGLang transfer
/// with one token per page).
pub const MAX_DESCRIPTORS: usize = 1 << 20;
/// The most addresses metadata may list.
pub const MAX_ADDRESSES: usize = 16;
/// The longest metadata JSON that is parsed at all.
pub const MAX_METADATA_JSON: usize = 4 << 20;
/// The largest single descriptor (1 TiB).
pub const MAX_DESCRIPTOR_SIZE: u64 = 1 << 40;
/// The largest total size of one operation (256 TiB).
pub const MAX_TOTAL_SIZE: u64 = 1 << 48;
const MAX_NAME: usize = 256;
/// The most transport blobs metadata may carry ([`RdmaMetadata::MAX_TRANSPORTS`]).
const MAX_TRANSPORTS: usize = 16;
/// The longest transport name, in bytes ([`RdmaMetadata::MAX_TRANSPORT_NAME`]).
const MAX_TRANSPORT_NAME: usize = 32;
/// The largest transport blob, in bytes ([`RdmaMetadata::MAX_TRANSPORT_BLOB`]).
const MAX_TRANSPORT_BLOB: usize = 4096;

/// What metadata says about `count` consecutive remote descriptors (or
/// blocks of a paged descriptor) of one device and size.
///
/// Metadata lists descriptors as such runs, so that a KV-cache transfer of
/// 16,384 blocks of 32 KiB is one entry: `{"device":"cpu","size":32768,
/// "count":16384}`. `count` is left out of the JSON when it is 1 (so
/// metadata of distinct descriptors reads as it always did), and metadata
/// merges neighbouring entries of the same device and size.
///
/// ```
/// use ferry_proto::{DescriptorInfo, Device};
/// let one = DescriptorInfo::new(Device::CPU, 4096);
/// assert_eq!(one.count, 1);
/// assert_eq!(DescriptorInfo::run(Device::CPU, 4096, 8).total(), 32768);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorInfo {
    /// Where the memory lives.
    pub device: Device,
    /// The length of each, in bytes.
    pub size: u64,
    /// How many descriptors in a row have this device and size (at least 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl DescriptorInfo {
    /// One descriptor.
    pub fn new(device: Device, size: u64) -> Self {
        Self::run(device, size, 1)
    }

    /// `count` descriptors of one device and size.
    pub fn run(device: Device, size: u64, count: u32) -> Self {
        DescriptorInfo {
            device,
            size,
            count,
        }
    }

    /// The bytes of all `count` descriptors (saturating).
    pub fn total(&self) -> u64 {
        self.size.saturating_mul(u64::from(self.count))
    }
}

/// What a passive operation hands to its remote, through any side channel, so
/// that the remote can read or write the exposed memory.
///
/// It is a capability: whoever holds it may touch the described bytes of this
/// one operation until the operation ends. Its `Debug` output hides the token;
/// treat its JSON like a password.
///
/// Besides the fields every transport reads, metadata may carry one opaque
/// blob per transport, under the transport's name (`"transports"` in the
/// JSON, a map from name to hexadecimal digits; absent when there is none,
/// so metadata without blobs is exactly the version-1 JSON it always was).
/// A reader asks for the names it knows
/// ([`transport_blob`](Self::transport_blob)) and ignores the others, which
/// still survive a parse and [`to_json`](Self::to_json) unchanged. Limits:
/// at most [`MAX_TRANSPORTS`](Self::MAX_TRANSPORTS) (16) blobs, each at most
/// [`MAX_TRANSPORT_BLOB`](Self::MAX_TRANSPORT_BLOB) (4 KiB) long, under names
/// of 1 to [`MAX_TRANSPORT_NAME`](Self::MAX_TRANSPORT_NAME) (32) characters
/// of `[a-z][a-z0-9_-]*`, each name once.
///
/// ```
/// # use ferry_proto::RdmaMetadata;
/// let err = RdmaMetadata::from_json("{\"version\": 1}").unwrap_err();
/// assert!(err.to_string().contains("missing field"));
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawMetadata", into = "RawMetadata")]
pub struct RdmaMetadata {
    kind: OperationKind,
    worker_id: String,
    hostname: String,
    host_id: String,
    addresses: Vec<SocketAddr>,
    operation_id: u64,
    token: Token,
    descriptors: Vec<DescriptorInfo>,
    process_id: Option<String>,
    transports: BTreeMap<String, Vec<u8>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    version: u32,
    operation_kind: u8,
    worker_id: String,
    hostname: String,
    host_id: String,
    addresses: Vec<String>,
    operation_id: u64,
    token: String,
    descriptors: Vec<DescriptorInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    process_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    transports: Option<RawTransports>,
}

fn check_name(s: &str, field: &'static str) -> Result<(), MetadataError> {
    if s.is_empty() || s.len() > MAX_NAME {
        return Err(MetadataError::BadName { field });
    }
    Ok(())
}

impl TryFrom<RawMetadata> for RdmaMetadata {
    type Error = MetadataError;

    fn try_from(r: RawMetadata) -> Result<Self, MetadataError> {
        if r.version != METADATA_VERSION {
            return Err(MetadataError::UnsupportedVersion { found: r.version });
        }
        let kind = OperationKind::from_u8(r.operation_kind)
            .ok_or(MetadataError::InvalidKind(r.operation_kind))?;
        let token = Token::from_hex(&r.token).ok_or(MetadataError::InvalidToken)?;
        if r.addresses.is_empty() {
            return Err(MetadataError::NoAddress);
        }
        if r.addresses.len() > MAX_ADDRESSES {
            return Err(MetadataError::TooManyAddresses(r.addresses.len()));
        }
        let addresses = r
            .addresses
            .iter()
            .map(|a| {
                a.parse::<SocketAddr>()
                    .map_err(|_| MetadataError::InvalidAddress(a.chars().take(64).collect()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let m = RdmaMetadata::new(
            kind,
            r.worker_id,
            r.hostname,
            r.host_id,
            addresses,
            r.operation_id,
            token,
            r.descriptors,
        )?;
        let mut m = match r.process_id {
            Some(p) => m.with_process_id(p)?,
            None => m,
        };
        for (name, hex) in r.transports.map(|t| t.0).unwrap_or_default() {
            check_transport_name(&name)?;
            // Sized before decoding: half the digits, rounded up.
            check_transport_blob(&name, hex.len().div_ceil(2))?;
            let blob = hex_decode(&hex)
                .ok_or_else(|| MetadataError::InvalidTransportBlob(name.clone()))?;
            if m.transports.contains_key(&name) {
                return Err(MetadataError::DuplicateTransport(name));
            }
            m = m.with_transport_blob(name, blob)?;
        }
        Ok(m)
    }
}

impl From<RdmaMetadata> for RawMetadata {
    fn from(m: RdmaMetadata) -> Self {
        RawMetadata {
            version: METADATA_VERSION,
            operation_kind: m.kind.as_u8(),
            worker_id: m.worker_id,
            hostname: m.hostname,
            host_id: m.host_id,
            addresses: m.addresses.iter().map(|a| a.to_string()).collect(),
            operation_id: m.operation_id,
            token: m.token.to_hex(),
            descriptors: m.descriptors,
            process_id: m.process_id,
            transports: (!m.transports.is_empty()).then(|| {
                RawTransports(
                    m.transports
                        .iter()
                        .map(|(name, blob)| (name.clone(), hex_encode(blob)))
                        .collect(),
                )
            }),
        }
    }
}

impl RdmaMetadata {
    /// Builds metadata, checking every field as [`from_json`](Self::from_json) does.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: OperationKind,
        worker_id: String,
        hostname: String,
        host_id: String,
        addresses: Vec<SocketAddr>,
        operation_id: u64,
        token: Token,
        descriptors: Vec<DescriptorInfo>,
    ) -> Result<Self, MetadataError> {
        check_name(&worker_id, "worker_id")?;
        check_name(&hostname, "hostname")?;
        check_name(&host_id, "host_id")?;
        if addresses.is_empty() {
            return Err(MetadataError::NoAddress);
        }
        if addresses.len() > MAX_ADDRESSES {
            return Err(MetadataError::TooManyAddresses(addresses.len()));
        }
        if descriptors.is_empty() {
            return Err(MetadataError::NoDescriptors);
        }
        let (mut count, mut total) = (0usize, 0u64);
        for d in &descriptors {
            if d.count == 0 {
                return Err(MetadataError::EmptyEntry { index: count });
            }
            if d.size > MAX_DESCRIPTOR_SIZE {
                return Err(MetadataError::DescriptorTooLarge {
                    index: count,
                    size: d.size,
                });
            }
            count = count.saturating_add(d.count as usize);
            if count > MAX_DESCRIPTORS {
                return Err(MetadataError::TooManyDescriptors(count));
            }
            // Cannot overflow: at most 2^20 descriptors of at most 2^40 bytes.
            total += d.total();
        }
        if total > MAX_TOTAL_SIZE {
            return Err(MetadataError::TotalTooLarge);
        }
        let descriptors = merge(descriptors);
        if descriptors.len() > MAX_RUNS {
            return Err(MetadataError::TooManyEntries(descriptors.len()));
        }
        Ok(RdmaMetadata {
            kind,
            worker_id,
            hostname,
            host_id,
            addresses,
            operation_id,
            token,
            descriptors,
            process_id: None,
            transports: BTreeMap::new(),
        })
    }

    /// Names the process that exposed the memory (an opaque random id), so
    /// that a connector in the same process can move the bytes with a plain
    /// copy.
    pub fn with_process_id(mut self, id: String) -> Result<Self, MetadataError> {
        check_name(&id, "process_id")?;
        self.process_id = Some(id);
        Ok(self)
    }

    /// The exposing process's id, if the metadata names it.
    pub fn process_id(&self) -> Option<&str> {
        self.process_id.as_deref()
    }

    /// The most transport blobs one metadata may carry.
    pub const MAX_TRANSPORTS: usize = MAX_TRANSPORTS;
    /// The longest transport name, in bytes (names are `[a-z][a-z0-9_-]*`).
    pub const MAX_TRANSPORT_NAME: usize = MAX_TRANSPORT_NAME;
    /// The largest transport blob, in bytes (twice as many hexadecimal
    /// digits in the JSON).
    pub const MAX_TRANSPORT_BLOB: usize = MAX_TRANSPORT_BLOB;

    /// Attaches an opaque blob for the transport `name` (what that transport
    /// needs to reach the exposed memory: keys, addresses, ...), replacing
    /// any blob already under that name.
    ///
    /// Refused: a name that is not 1 to [`MAX_TRANSPORT_NAME`](Self::MAX_TRANSPORT_NAME)
    /// bytes of `[a-z][a-z0-9_-]*` ([`MetadataError::BadTransportName`]), a
    /// blob longer than [`MAX_TRANSPORT_BLOB`](Self::MAX_TRANSPORT_BLOB)
    /// ([`MetadataError::TransportBlobTooLarge`]), and a new name when
    /// [`MAX_TRANSPORTS`](Self::MAX_TRANSPORTS) are there already
    /// ([`MetadataError::TooManyTransports`]).
    ///
    /// ```
    /// # use ferry_proto::{DescriptorInfo, Device, OperationKind, RdmaMetadata, Token};
    /// # let m = RdmaMetadata::new(OperationKind::Read, "w".into(), "h".into(), "b".into(),
    /// #     vec!["127.0.0.1:1".parse().unwrap()], 1, Token::from_bytes([7; 16]),
    /// #     vec![DescriptorInfo::new(Device::CPU, 8)]).unwrap();
    /// let m = m.with_transport_blob("rdma", vec![1, 2, 3])?;
    /// assert!(m.to_json().contains(r#""transports":{"rdma":"010203"}"#));
    /// let back = RdmaMetadata::from_json(&m.to_json())?;
    /// assert_eq!(back.transport_blob("rdma"), Some(&[1u8, 2, 3][..]));
    /// assert_eq!(back.transport_blob("ucx"), None);
    /// # Ok::<(), ferry_proto::MetadataError>(())
    /// ```
    pub fn with_transport_blob(
        mut self,
        name: impl Into<String>,
        blob: impl Into<Vec<u8>>,
    ) -> Result<Self, MetadataError> {
        let name = name.into();
        let blob = blob.into();
        check_transport_name(&name)?;
        check_transport_blob(&name, blob.len())?;
        if !self.transports.contains_key(&name) && self.transports.len() == MAX_TRANSPORTS {
            return Err(MetadataError::TooManyTransports(MAX_TRANSPORTS + 1));
        }
        self.transports.insert(name, blob);
        Ok(self)
    }

    /// The blob for the transport `name`, if the metadata carries one.
    pub fn transport_blob(&self, name: &str) -> Option<&[u8]> {
        self.transports.get(name).map(Vec::as_slice)
    }

    /// Every transport blob, by name in byte order (known and unknown names
    /// alike).
    pub fn transport_blobs(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.transports
            .iter()
            .map(|(name, blob)| (name.as_str(), blob.as_slice()))
    }

    /// Parses and validates metadata JSON.
    pub fn from_json(json: &str) -> Result<Self, MetadataError> {
        Self::from_json_bytes(json.as_bytes())
    }

    /// Parses and validates metadata JSON given as bytes.
    pub fn from_json_bytes(json: &[u8]) -> Result<Self, MetadataError> {
        if json.len() > MAX_METADATA_JSON {
            return Err(MetadataError::TooLarge { len: json.len() });
        }
        serde_json::from_slice(json).map_err(|e| {
            // serde_json wraps our own validation errors in its message; keep
            // the message, it already says which field is wrong.
            MetadataError::Json(e.to_string())
        })
    }

    /// The JSON form, to hand to the remote worker.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("metadata always serializes")
    }

    /// What the remote may do: READ for a readable, WRITE for a writable.
    pub fn kind(&self) -> OperationKind {
        self.kind
    }
    /// The id of the worker that exposed the memory.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }
    /// The host name of that worker (informational).
    pub fn hostname(&self) -> &str {
        &self.hostname
    }
    /// An identity of that worker's host (kernel boot id), used to detect same-host peers.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }
    /// Where the worker listens.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }
    /// The operation's number within its connector.
    pub fn operation_id(&self) -> u64 {
        self.operation_id
    }
    /// The capability token.
    pub fn token(&self) -> &Token {
        &self.token
    }
    /// The exposed descriptors, as runs of one device and size (neighbours
    /// of the same device and size are merged).
    pub fn descriptors(&self) -> &[DescriptorInfo] {
        &self.descriptors
    }
    /// How many descriptors (blocks) are exposed: the sum of the counts.
    pub fn descriptor_count(&self) -> usize {
        self.descriptors.iter().map(|d| d.count as usize).sum()
    }
    /// The size of every exposed descriptor (block), in order.
    pub fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.descriptor_count());
        for d in &self.descriptors {
            out.extend(std::iter::repeat(d.size).take(d.count as usize));
        }
        out
    }
    /// The total number of exposed bytes.
    pub fn total_size(&self) -> u64 {
        self.descriptors.iter().map(|d| d.total()).sum()
    }

    /// Replaces the addresses (e.g. after a NAT or port forward). Checked as on parse.
    pub fn with_addresses(mut self, addresses: Vec<SocketAddr>) -> Result<Self, MetadataError> {
        if addresses.is_empty() {
            return Err(MetadataError::NoAddress);
        }
        if addresses.len() > MAX_ADDRESSES {
            return Err(MetadataError::TooManyAddresses(addresses.len()));
        }
        self.addresses = addresses;
        Ok(self)
    }
}

impl fmt::Debug for RdmaMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaMetadata")
            .field("kind", &self.kind)
            .field("worker_id", &self.worker_id)
            .field("hostname", &self.hostname)
            .field("addresses", &self.addresses)
            .field("operation_id", &self.operation_id)
            .field("token", &self.token)
            .field("descriptors", &self.descriptor_count())
            .field("total_size", &self.total_size())
            // Names only: a blob may hold keys.
            .field("transports", &self.transports.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Merges neighbouring entries of the same device and size (counts are
/// checked: their sum fits in `MAX_DESCRIPTORS`).
fn merge(entries: Vec<DescriptorInfo>) -> Vec<DescriptorInfo> {
    let mut out: Vec<DescriptorInfo> = Vec::with_capacity(entries.len());
    for d in entries {
        match out.last_mut() {
            Some(l) if l.device == d.device && l.size == d.size => l.count += d.count,
            _ => out.push(d),
        }
    }
    out
}

#[cfg(test)]
mod tests;
