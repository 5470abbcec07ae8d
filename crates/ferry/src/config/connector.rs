//! [`Config`]: what configures one connector, resolved once from its
//! builder and the environment.

use std::net::SocketAddr;
use std::time::Duration;

use super::names::*;
use super::{flag, number, text, Env, Knob, Origin, Problem, Setting, SettingError};
use crate::auth::Secret;
use crate::builder::{
    ConnectorBuilder, DEFAULT_CMA_THRESHOLD, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_STRIPE_THRESHOLD, MIN_SECRET,
};
use crate::kind::TransportKind;
use crate::transport::admission::Grouping;

/// A connector's configuration as resolved from its
/// [`ConnectorBuilder`] and the environment (see [the module](crate::config)):
/// every knob validated, each with where its value came from.
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) transports: Setting<Vec<TransportKind>>,
    pub(crate) secret: Setting<Option<Secret>>,
    pub(crate) cma_threshold: Setting<u64>,
    /// `None`: by host (see `ConnectorBuilder::tcp_streams`).
    pub(crate) tcp_streams: Setting<Option<usize>>,
    pub(crate) stripe_threshold: Setting<u64>,
    pub(crate) idle_timeout: Setting<Duration>,
    pub(crate) max_connections: Setting<usize>,
    pub(crate) admission: Setting<Grouping>,
    pub(crate) metrics_addr: Setting<Option<SocketAddr>>,
    pub(crate) ucx_emulated_rma: Setting<bool>,
    pub(crate) ucx_strict_registration: Setting<bool>,
    pub(crate) ucx_trusted_network: Setting<bool>,
    /// The liveness bound; zero: off.
    pub(crate) liveness: Setting<Duration>,
    /// The end-to-end integrity check (`FERRY_DIGEST`).
    pub(crate) digest: Setting<bool>,
}

impl Config {
    /// Resolves `builder`'s configuration against the process's
    /// environment: the builder's settings first, then the `FERRY_*`
    /// variables, then the defaults. Fails on the first malformed value.
    pub fn resolve(builder: &ConnectorBuilder) -> Result<Config, SettingError> {
        Config::resolve_in(builder, &super::process_env)
    }

    /// [`resolve`](Self::resolve) against `env`.
    pub(crate) fn resolve_in(b: &ConnectorBuilder, env: Env<'_>) -> Result<Config, SettingError> {
        let transports = Setting::pick(
            b.transports.clone(),
            transports_env(env)?,
            TransportKind::ALL.to_vec(),
        );
        if !transports.value.contains(&TransportKind::Tcp) {
            let names: Vec<_> = transports.value.iter().map(|t| t.name()).collect();
            return Err(transports.invalid(TRANSPORTS_ENV, Some(names.join(",")), Problem::NoTcp));
        }
        // The secret is taken as it is (not trimmed; empty is too short).
        let env_secret = env(SECRET_ENV)
            .and_then(|v| v.into_string().ok())
            .map(|s| Secret::new(s.as_bytes()));
        let secret = Setting::pick(b.secret.clone().map(Some), env_secret.map(Some), None);
        // A recorded first handshake message lets an eavesdropper test
        // guesses of the secret offline: a short secret could be found.
        if secret.value.as_ref().is_some_and(|s| s.len() < MIN_SECRET) {
            return Err(secret.invalid(SECRET_ENV, None, Problem::TooShort(MIN_SECRET)));
        }
        let cma_threshold = Setting::pick(
            b.cma_threshold,
            number(env, CMA_THRESHOLD_ENV, "bytes")?,
            DEFAULT_CMA_THRESHOLD,
        );
        let stripe_threshold = Setting::pick(
            b.stripe_threshold,
            number(env, STRIPE_THRESHOLD_ENV, "bytes")?,
            DEFAULT_STRIPE_THRESHOLD,
        );
        let tcp_streams = Setting::pick(
            b.tcp_streams.map(Some),
            number(env, TCP_STREAMS_ENV, "streams")?.map(Some),
            None,
        );
        let max = usize::from(ferry_proto::wire::MAX_PARTS);
        if let Some(n) = tcp_streams.value.filter(|&n| n == 0 || n > max) {
            return Err(tcp_streams.invalid(
                TCP_STREAMS_ENV,
                Some(n.to_string()),
                Problem::OutOfRange {
                    min: 1,
                    max: max as u64,
                },
            ));
        }
        let idle_timeout = Setting::pick(
            b.idle_timeout,
            number(env, IDLE_TIMEOUT_ENV, "seconds")?.map(Duration::from_secs),
            DEFAULT_IDLE_TIMEOUT,
        );
        if idle_timeout.value.is_zero() {
            // As it was given: seconds in the variable, a duration in code.
            let shown = match idle_timeout.origin {
                Origin::Environment => idle_timeout.value.as_secs().to_string(),
                _ => format!("{:?}", idle_timeout.value),
            };
            return Err(idle_timeout.invalid(IDLE_TIMEOUT_ENV, Some(shown), Problem::NotPositive));
        }
        let max_connections = Setting::pick(
            b.max_connections,
            number(env, MAX_CONNECTIONS_ENV, "connections")?,
            DEFAULT_MAX_CONNECTIONS,
        );
        if max_connections.value == 0 {
            let shown = Some("0".to_string());
            return Err(max_connections.invalid(MAX_CONNECTIONS_ENV, shown, Problem::NotPositive));
        }
        let admission = Setting::pick(
            b.admission_prefixes.map(|(v4, v6)| Grouping { v4, v6 }),
            prefixes_env(env)?,
            Grouping::default(),
        );
        let Grouping { v4, v6 } = admission.value;
        if v4 > 32 || v6 > 128 {
            let shown = Some(format!("{v4},{v6}"));
            return Err(admission.invalid(ADMISSION_PREFIXES_ENV, shown, Problem::PrefixTooLong));
        }
        Ok(Config {
            transports,
            secret,
            cma_threshold,
            tcp_streams,
            stripe_threshold,
            idle_timeout,
            max_connections,
            admission,
            metrics_addr: Setting::pick(b.metrics_addr.map(Some), metrics_env(env)?, None),
            ucx_emulated_rma: Setting::pick(
                b.ucx_emulated_rma,
                flag(env, UCX_EMULATED_RMA_ENV)?,
                false,
            ),
            ucx_strict_registration: Setting::pick(
                b.ucx_strict_registration,
                flag(env, UCX_STRICT_REGISTRATION_ENV)?,
                false,
            ),
            ucx_trusted_network: Setting::pick(
                b.ucx_trusted_network,
                flag(env, UCX_TRUSTED_NETWORK_ENV)?,
                false,
            ),
            liveness: Setting::pick(
                b.liveness,
                number(env, LIVENESS_ENV, "milliseconds")?.map(Duration::from_millis),
                crate::builder::DEFAULT_LIVENESS,
            ),
            digest: Setting::pick(b.digest, digest_env(env)?, false),
        })
    }

    /// Whether the transports were chosen (by the builder or the
    /// environment) rather than left to the default.
    pub(crate) fn transports_named(&self) -> bool {
        self.transports.origin != Origin::Default
    }

    /// Every knob of the connector: its variable, its value, where it came
    /// from.
    pub fn knobs(&self) -> Vec<Knob> {
        let yes_no = |b: &bool| if *b { "yes" } else { "no" }.to_string();
        vec![
            self.transports.knob(TRANSPORTS_ENV, |t| {
                let names: Vec<_> = t.iter().map(|t| t.name()).collect();
                names.join(",")
            }),
            self.secret.knob(SECRET_ENV, |s| {
                match s {
                    Some(_) => "set (connections authenticated and encrypted)",
                    None => "none",
                }
                .to_string()
            }),
            self.cma_threshold
                .knob(CMA_THRESHOLD_ENV, |n| format!("{n} bytes")),
            self.tcp_streams.knob(TCP_STREAMS_ENV, |n| match n {
                Some(n) => n.to_string(),
                None => format!(
                    "{} to other hosts, 1 on this host",
                    crate::builder::DEFAULT_TCP_STREAMS
                ),
            }),
            self.stripe_threshold
                .knob(STRIPE_THRESHOLD_ENV, |n| format!("{n} bytes")),
            self.idle_timeout
                .knob(IDLE_TIMEOUT_ENV, |d| format!("{} s", d.as_secs_f64())),
            self.max_connections
                .knob(MAX_CONNECTIONS_ENV, |n| n.to_string()),
            self.admission
                .knob(ADMISSION_PREFIXES_ENV, |g| format!("{},{}", g.v4, g.v6)),
            self.metrics_addr.knob(METRICS_ADDR_ENV, |a| match a {
                Some(a) => a.to_string(),
                None => "not served".into(),
            }),
            self.ucx_emulated_rma.knob(UCX_EMULATED_RMA_ENV, yes_no),
            self.ucx_strict_registration
                .knob(UCX_STRICT_REGISTRATION_ENV, yes_no),
            self.ucx_trusted_network
                .knob(UCX_TRUSTED_NETWORK_ENV, yes_no),
            self.liveness.knob(LIVENESS_ENV, |d| {
                if d.is_zero() {
                    "off".to_string()
                } else {
                    format!("{} ms", d.as_millis())
                }
            }),
            self.digest.knob(DIGEST_ENV, |on| {
                if *on {
                    "crc32 (every byte checked end to end)"
                } else {
                    "off"
                }
                .to_string()
            }),
        ]
    }
}

/// `FERRY_TRANSPORTS`, if set: names separated by commas.
fn transports_env(env: Env<'_>) -> Result<Option<Vec<TransportKind>>, SettingError> {
    let Some(v) = text(env, TRANSPORTS_ENV) else {
        return Ok(None);
    };
    v.split(',')
        .map(|name| {
            let name = name.trim();
            TransportKind::ALL
                .iter()
                .copied()
                .find(|t| t.name() == name)
                .ok_or_else(|| SettingError {
                    name: TRANSPORTS_ENV,
                    origin: Origin::Environment,
                    value: Some(v.clone()),
                    problem: Problem::UnknownTransport(name.to_string()),
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `FERRY_DIGEST`, if set: `0`, `1`, or the algorithm's name (`crc32`).
fn digest_env(env: Env<'_>) -> Result<Option<bool>, SettingError> {
    let Some(v) = text(env, DIGEST_ENV) else {
        return Ok(None);
    };
    match v.trim() {
        "0" => Ok(Some(false)),
        "1" | "crc32" => Ok(Some(true)),
        _ => Err(SettingError {
            name: DIGEST_ENV,
            origin: Origin::Environment,
            value: Some(v),
            problem: Problem::NotAFlag,
        }),
    }
}

/// `FERRY_ADMISSION_PREFIXES`, if set: `V4,V6`.
fn prefixes_env(env: Env<'_>) -> Result<Option<Grouping>, SettingError> {
    let Some(v) = text(env, ADMISSION_PREFIXES_ENV) else {
        return Ok(None);
    };
    parse_prefixes(&v)
        .map(|(v4, v6)| Some(Grouping { v4, v6 }))
        .ok_or(SettingError {
            name: ADMISSION_PREFIXES_ENV,
            origin: Origin::Environment,
            value: Some(v),
            problem: Problem::NotTwoPrefixes,
        })
}

/// `"V4,V6"`, e.g. `"24,64"`.
pub(super) fn parse_prefixes(v: &str) -> Option<(u8, u8)> {
    let (a, b) = v.trim().split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// `FERRY_METRICS_ADDR`, if set.
fn metrics_env(env: Env<'_>) -> Result<Option<Option<SocketAddr>>, SettingError> {
    let Some(v) = text(env, METRICS_ADDR_ENV) else {
        return Ok(None);
    };
    match crate::metrics::parse_addr(&v) {
        Some(a) => Ok(Some(Some(a))),
        None => Err(SettingError {
            name: METRICS_ADDR_ENV,
            origin: Origin::Environment,
            value: Some(v),
            problem: Problem::NotAnAddress,
        }),
    }
}
