use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The kind of memory a [`Device`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host memory.
    Cpu,
    /// Memory of a CUDA device.
    Cuda,
}

/// Where a buffer lives: `cpu`, or `cuda:N` (`cuda` alone means `cuda:0`).
///
/// ```
/// use ferry_proto::{Device, DeviceKind};
/// let d: Device = "cuda:1".parse().unwrap();
/// assert_eq!(d.kind(), DeviceKind::Cuda);
/// assert_eq!(d.id(), 1);
/// assert_eq!("cuda".parse::<Device>().unwrap().to_string(), "cuda:0");
/// assert!("gpu".parse::<Device>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    kind: DeviceKind,
    id: u32,
}

/// A device string that is not `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid device {input:?}: expected \"cpu\", \"cuda\" or \"cuda:N\" with N a device number"
)]
pub struct ParseDeviceError {
    input: String,
}

impl Device {
    /// Host memory.
    pub const CPU: Device = Device {
        kind: DeviceKind::Cpu,
        id: 0,
    };

    /// The CUDA device with ordinal `id`.
    pub const fn cuda(id: u32) -> Device {
        Device {
            kind: DeviceKind::Cuda,
            id,
        }
    }

    /// The kind of memory.
    pub const fn kind(&self) -> DeviceKind {
        self.kind
    }

    /// The device ordinal (always 0 for `cpu`).
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// Whether this is host memory.
    pub const fn is_cpu(&self) -> bool {
        matches!(self.kind, DeviceKind::Cpu)
    }
}

impl Default for Device {
    fn default() -> Self {
        Device::CPU
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Cpu => f.write_str("cpu"),
            DeviceKind::Cuda => write!(f, "cuda:{}", self.id),
        }
    }
}

impl FromStr for Device {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseDeviceError {
            input: s.chars().take(64).collect(),
        };
        match s {
            "cpu" => Ok(Device::CPU),
            "cuda" => Ok(Device::cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(err)?;
                // Only plain decimal digits: no sign, no spaces, no leading "+".
                if n.is_empty() || n.len() > 9 || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(err());
                }
                n.parse().map(Device::cuda).map_err(|_| err())
            }
        }
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_three_forms() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::CPU);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::cuda(0));
        assert_eq!("cuda:7".parse::<Device>().unwrap(), Device::cuda(7));
        assert_eq!(Device::CPU.to_string(), "cpu");
        assert_eq!(Device::cuda(3).to_string(), "cuda:3");
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "CPU",
            "gpu",
            "cuda:",
            "cuda:-1",
            "cuda:+1",
            "cuda: 1",
            "cuda:1 ",
            "cuda:x",
            "cpu:0",
            "cuda:99999999999",
            "cuda:1:2",
        ] {
            let e = bad.parse::<Device>().unwrap_err();
            assert!(e.to_string().contains("expected"), "{bad:?}: {e}");
        }
    }
}
