//! The UCX lane of a grant: where the holder's UCX endpoint goes, and the
//! remote keys of the granted memory and of the owner's control words.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::GrantError;

/// The longest worker address a grant carries, in bytes (hex doubles it in
/// the JSON, which must stay within 1 KiB in all).
pub const MAX_UCX_ADDRESS: usize = 320;
/// The longest packed remote key a grant carries, in bytes.
pub const MAX_UCX_RKEY: usize = 96;

/// The UCX lane of a grant: the owner's UCX worker (one per grant, shut
/// down when the grant is revoked), the remote key of the granted memory
/// (registered for this grant alone) and the one of the owner's control
/// words (state and block generations, read one-sidedly before each
/// transfer).
#[derive(Clone, PartialEq, Eq)]
pub struct UcxGrant {
    /// The owner's grant worker address (`ucp_worker_get_address`).
    pub address: Vec<u8>,
    /// The packed remote key of the granted memory.
    pub rkey: Vec<u8>,
    /// The address of block 0 in the owner's memory.
    pub base: u64,
    /// The packed remote key of the owner's control words.
    pub control_rkey: Vec<u8>,
    /// The address of the control words in the owner's memory.
    pub control_base: u64,
    /// A keyed digest of the fields above and of the grant's token: the
    /// holder checks it before handing the bytes to UCX (which parses
    /// them without defence), so a section mixed up, truncated or edited
    /// without the token is refused, typed.
    pub seal: [u8; 16],
}

impl fmt::Debug for UcxGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UcxGrant")
            .field("address_len", &self.address.len())
            .field("base", &format_args!("{:#x}", self.base))
            .field("control_base", &format_args!("{:#x}", self.control_base))
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUcx {
    address: String,
    rkey: String,
    base: u64,
    control_rkey: String,
    control_base: u64,
    seal: String,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str, what: &str, max: usize) -> Result<Vec<u8>, GrantError> {
    let bad = || {
        GrantError::Malformed(format!(
            "the ucx lane's {what} is not hex of 1 to {max} bytes"
        ))
    };
    if s.is_empty() || s.len() % 2 != 0 || s.len() > 2 * max {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

impl UcxGrant {
    /// Checks lengths and ranges (`total`: the granted bytes).
    pub fn validate(&self, total: u64) -> Result<(), GrantError> {
        let bad = |m: &str| Err(GrantError::Malformed(format!("the ucx lane's {m}")));
        if self.address.is_empty() || self.address.len() > MAX_UCX_ADDRESS {
            return bad("worker address is empty or too long");
        }
        for k in [&self.rkey, &self.control_rkey] {
            if k.is_empty() || k.len() > MAX_UCX_RKEY {
                return bad("remote key is empty or too long");
            }
        }
        if self.base == 0 || self.base.checked_add(total).is_none() || self.control_base == 0 {
            return bad("memory does not fit the address space");
        }
        Ok(())
    }

    pub(super) fn to_raw(&self) -> RawUcx {
        RawUcx {
            address: hex(&self.address),
            rkey: hex(&self.rkey),
            base: self.base,
            control_rkey: hex(&self.control_rkey),
            control_base: self.control_base,
            seal: hex(&self.seal),
        }
    }

    pub(super) fn from_raw(r: RawUcx) -> Result<UcxGrant, GrantError> {
        let seal = unhex(&r.seal, "seal", 16)?;
        Ok(UcxGrant {
            address: unhex(&r.address, "worker address", MAX_UCX_ADDRESS)?,
            rkey: unhex(&r.rkey, "remote key", MAX_UCX_RKEY)?,
            base: r.base,
            control_rkey: unhex(&r.control_rkey, "control key", MAX_UCX_RKEY)?,
            control_base: r.control_base,
            seal: seal
                .try_into()
                .map_err(|_| GrantError::Malformed("the ucx lane's seal is not 16 bytes".into()))?,
        })
    }

    /// The bytes the seal covers: every field but the seal, framed.
    pub fn sealed_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.address.len() + 2 * MAX_UCX_RKEY + 32);
        for part in [&self.address, &self.rkey, &self.control_rkey] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part);
        }
        out.extend_from_slice(&self.base.to_le_bytes());
        out.extend_from_slice(&self.control_base.to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{tests::sample_metadata, GrantMetadata, MAX_GRANT_JSON};
    use super::*;

    fn lane(address: usize, key: usize) -> UcxGrant {
        UcxGrant {
            address: vec![0xa5; address],
            rkey: vec![0x11; key],
            base: 0x7f00_0000_0000,
            control_rkey: vec![0x22; key],
            control_base: 0x7f10_0000_0000,
            seal: [0x33; 16],
        }
    }

    #[test]
    fn the_ucx_lane_round_trips_and_is_checked() {
        let m = GrantMetadata {
            ucx: Some(lane(150, 40)),
            ..sample_metadata()
        };
        let json = m.to_json().unwrap();
        assert!(json.len() <= MAX_GRANT_JSON, "{}", json.len());
        assert_eq!(GrantMetadata::from_json(&json).unwrap(), m);
        assert!(!format!("{m:?}").contains("a5a5"));
        for bad in [
            lane(0, 40),
            lane(MAX_UCX_ADDRESS + 1, 40),
            lane(150, 0),
            lane(150, 97),
        ] {
            let m = GrantMetadata {
                ucx: Some(bad),
                ..sample_metadata()
            };
            assert!(matches!(m.validate(), Err(GrantError::Malformed(_))));
        }
        let forged = json.replace("\"seal\":\"3333", "\"seal\":\"zz33");
        assert!(matches!(
            GrantMetadata::from_json(&forged),
            Err(GrantError::Malformed(_))
        ));
    }

    #[test]
    fn hex_is_checked() {
        assert_eq!(unhex("00ff", "x", 4).unwrap(), vec![0, 255]);
        for bad in ["", "0", "zz", "0000000000", "é0"] {
            assert!(unhex(bad, "x", 4).is_err(), "{bad}");
        }
    }
}
