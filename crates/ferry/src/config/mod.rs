//! Configuration, read once: every `FERRY_*` variable that configures the
//! library is read and validated here, and nowhere else.
//!
//! Two parts:
//!
//! - [`Config`]: what configures one connector, resolved by
//!   [`Config::resolve`] from its [`ConnectorBuilder`](crate::ConnectorBuilder)
//!   and the environment. A builder setting always wins over its variable;
//!   without either, the default. `FERRY_TRANSPORTS`, `FERRY_SECRET`,
//!   `FERRY_CMA_THRESHOLD`, `FERRY_TCP_STREAMS`, `FERRY_STRIPE_THRESHOLD`,
//!   `FERRY_IDLE_TIMEOUT`, `FERRY_MAX_CONNECTIONS`,
//!   `FERRY_ADMISSION_PREFIXES`, `FERRY_METRICS_ADDR`,
//!   `FERRY_UCX_EMULATED_RMA`, `FERRY_UCX_STRICT_REGISTRATION`,
//!   `FERRY_UCX_TRUSTED_NETWORK`, `FERRY_LIVENESS_MS`, `FERRY_DIGEST`.
//! - [`ProcessConfig`]: what holds for the whole process and no builder
//!   sets, read the first time it is asked for ([`process`]) and passed
//!   down from there: `FERRY_UCX_LIB` and `FERRY_CUDA_LIB` (which library
//!   to load; also `VIRTUAL_ENV`, `CONDA_PREFIX` and `HOME`, where the PyPI
//!   UCX may be), `FERRY_UCX_CUDA`, `FERRY_CMA_THREADS`,
//!   `FERRY_CMA_PROBE_TIMEOUT_MS`, `FERRY_CMA_PROBE_FILES`.
//!
//! A malformed value (not a number, out of range, a flag other than `0` or
//! `1`) is a [`SettingError`] that names the variable, the value and what
//! is wrong; [`ConnectorBuilder::build`](crate::ConnectorBuilder::build)
//! fails with it ([`Error::InvalidSetting`](crate::Error::InvalidSetting)).
//! A variable set to nothing (or blanks) counts as unset. [`Config::knobs`]
//! and [`ProcessConfig::knobs`] list every knob with its value and where
//! it came from; `ferry status` prints them.
//!
//! Not read here: the hooks of tests, CI and benchmarks, which stay with
//! the code that uses them (`FERRY_TEST_*`, `FERRY_REQUIRE_*`,
//! `FERRY_FAKE_CUDA_*`, `FERRY_SIMULATED_GPU` in the CLI and the Python
//! module), `UCX_*` (read by UCX itself), and `ferry-control`'s own
//! configuration.

use std::ffi::OsString;
use std::fmt;

mod connector;
mod names;
mod process;
#[cfg(test)]
mod tests;

pub use connector::Config;
pub use names::*;
#[cfg(test)]
pub(crate) use process::DEFAULT_PROBE_FILES;
pub use process::{process, ProcessConfig};

/// Where a knob's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Origin {
    /// Neither the builder nor the environment set it.
    Default,
    /// Its environment variable.
    Environment,
    /// The [`ConnectorBuilder`](crate::ConnectorBuilder).
    Builder,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Default => "default",
            Origin::Environment => "environment",
            Origin::Builder => "builder",
        })
    }
}

/// One knob as resolved: its environment variable, its value in words, and
/// where the value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knob {
    /// The environment variable (the knob's name).
    pub name: &'static str,
    /// The value in use, in words (a secret shows only that it is set).
    pub value: String,
    /// Where it came from.
    pub origin: Origin,
}

/// What is wrong with a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// Not a whole number (of the unit named).
    #[error("is not a number of {0}")]
    NotANumber(&'static str),
    /// A number outside the range the knob allows.
    #[error("must be {min} to {max}")]
    OutOfRange {
        /// The smallest value allowed.
        min: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// Zero, where only a positive number makes sense.
    #[error("must be positive")]
    NotPositive,
    /// Prefix lengths longer than an address.
    #[error("must be at most 32 (IPv4) and 128 (IPv6)")]
    PrefixTooLong,
    /// A flag that is neither `1` (on) nor `0` (off).
    #[error("is not 1 (on) or 0 (off)")]
    NotAFlag,
    /// Not `IP:PORT` or a port.
    #[error("is not an address (IP:PORT, or PORT for loopback)")]
    NotAnAddress,
    /// Not two prefix lengths.
    #[error("is not two prefix lengths, as in \"24,64\"")]
    NotTwoPrefixes,
    /// A transport this build does not have.
    #[error("names a transport this build does not have ({0:?}); it has: local, cma, ucx, tcp")]
    UnknownTransport(String),
    /// Transports without `tcp`.
    #[error("leaves out tcp, which cannot be disabled: it is the fallback every remote relies on")]
    NoTcp,
    /// A shared secret shorter than the minimum.
    #[error("is shorter than {0} bytes (use random bytes, e.g. 32 hexadecimal digits)")]
    TooShort(usize),
}

/// A knob set to a value it cannot take: which knob, set where, to what
/// (never shown for the secret), and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SettingError {
    /// The knob's environment variable.
    pub name: &'static str,
    /// Where the value came from ([`Origin::Environment`] or
    /// [`Origin::Builder`]).
    pub origin: Origin,
    /// The value as given (`None` for the secret).
    pub value: Option<String>,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.origin, names::builder_method(self.name)) {
            (Origin::Builder, Some(m)) => write!(f, "ConnectorBuilder::{m}")?,
            _ => f.write_str(self.name)?,
        }
        match &self.value {
            Some(v) if self.origin == Origin::Builder => write!(f, " ({v})")?,
            Some(v) => write!(f, "={v:?}")?,
            None => {}
        }
        write!(f, " {}", self.problem)
    }
}

/// Where the values of environment variables come from: the process's
/// environment, or a table in tests.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process's environment: the one place Ferry reads it.
pub(crate) fn process_env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// The value of `name`, if it is set, is text, and is not blank (trimmed).
fn text(env: Env<'_>, name: &str) -> Option<String> {
    let v = env(name)?.into_string().ok()?;
    let t = v.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// A number from `name` (of `unit`), if set.
fn number<T: std::str::FromStr>(
    env: Env<'_>,
    name: &'static str,
    unit: &'static str,
) -> Result<Option<T>, SettingError> {
    let Some(v) = text(env, name) else {
        return Ok(None);
    };
    v.parse().map(Some).map_err(|_| SettingError {
        name,
        origin: Origin::Environment,
        value: Some(v),
        problem: Problem::NotANumber(unit),
    })
}

/// A flag from `name` (`1` on, `0` off), if set.
fn flag(env: Env<'_>, name: &'static str) -> Result<Option<bool>, SettingError> {
    match text(env, name).as_deref() {
        None => Ok(None),
        Some("1") => Ok(Some(true)),
        Some("0") => Ok(Some(false)),
        Some(v) => Err(SettingError {
            name,
            origin: Origin::Environment,
            value: Some(v.to_string()),
            problem: Problem::NotAFlag,
        }),
    }
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Setting<T> {
    pub(crate) value: T,
    pub(crate) origin: Origin,
}

impl<T> Setting<T> {
    /// The builder's value, else the environment's, else `default`.
    fn pick(builder: Option<T>, env: Option<T>, default: T) -> Setting<T> {
        match (builder, env) {
            (Some(value), _) => Setting {
                value,
                origin: Origin::Builder,
            },
            (None, Some(value)) => Setting {
                value,
                origin: Origin::Environment,
            },
            (None, None) => Setting {
                value: default,
                origin: Origin::Default,
            },
        }
    }

    /// A knob `name` showing the value as `show` words it.
    fn knob(&self, name: &'static str, show: impl FnOnce(&T) -> String) -> Knob {
        Knob {
            name,
            value: show(&self.value),
            origin: self.origin,
        }
    }

    /// The error of a value out of the knob's range.
    fn invalid(&self, name: &'static str, shown: Option<String>, problem: Problem) -> SettingError {
        SettingError {
            name,
            origin: self.origin,
            value: shown,
            problem,
        }
    }
}
