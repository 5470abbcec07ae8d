//! [`Config`]: who may fetch and who may answer — the deployment's secret,
//! HTTP bearer tokens, NATS credentials, etcd users — and the environment
//! variables that set them.

use std::net::IpAddr;
use std::sync::Arc;

use crate::seal::Keys;
use crate::{Error, Result};

/// The deployment's shared secret (the same variable the connector reads).
pub const SECRET_ENV: &str = "FERRY_SECRET";
/// Set to `1`: serve metadata without a secret on addresses that other
/// hosts can reach (see [`Config::trusted_network`]).
pub const TRUSTED_NETWORK_ENV: &str = "FERRY_CONTROL_TRUSTED_NETWORK";
/// The HTTP bearer token (see [`Config::bearer_token`]).
pub const TOKEN_ENV: &str = "FERRY_CONTROL_TOKEN";
/// The NATS user name (with [`NATS_PASSWORD_ENV`]).
pub const NATS_USER_ENV: &str = "FERRY_NATS_USER";
/// The NATS password (with [`NATS_USER_ENV`]).
pub const NATS_PASSWORD_ENV: &str = "FERRY_NATS_PASSWORD";
/// The NATS authentication token.
pub const NATS_TOKEN_ENV: &str = "FERRY_NATS_TOKEN";
/// The NATS NKey seed (`SU...`).
pub const NATS_NKEY_ENV: &str = "FERRY_NATS_NKEY";
/// The path of a NATS credentials file (user JWT and NKey seed).
pub const NATS_CREDS_ENV: &str = "FERRY_NATS_CREDS";
/// The etcd user name (with [`ETCD_PASSWORD_ENV`]).
pub const ETCD_USER_ENV: &str = "FERRY_ETCD_USER";
/// The etcd user's password (with [`ETCD_USER_ENV`]).
pub const ETCD_PASSWORD_ENV: &str = "FERRY_ETCD_PASSWORD";
/// The shortest secret accepted, in bytes (as for the connector).
pub const MIN_SECRET: usize = 16;

/// How the control plane authenticates. Every setting left unset here is
/// read from its environment variable when the server binds, the client is
/// made or the channel connects:
///
/// | Setting | Variable |
/// | --- | --- |
/// | [`secret`](Self::secret) | `FERRY_SECRET` |
/// | [`trusted_network`](Self::trusted_network) | `FERRY_CONTROL_TRUSTED_NETWORK=1` |
/// | [`bearer_token`](Self::bearer_token) | `FERRY_CONTROL_TOKEN` |
/// | [`nats_user_and_password`](Self::nats_user_and_password) | `FERRY_NATS_USER`, `FERRY_NATS_PASSWORD` |
/// | [`nats_token`](Self::nats_token) | `FERRY_NATS_TOKEN` |
/// | [`nats_nkey`](Self::nats_nkey) | `FERRY_NATS_NKEY` |
/// | [`nats_credentials_file`](Self::nats_credentials_file) | `FERRY_NATS_CREDS` |
/// | [`etcd_user_and_password`](Self::etcd_user_and_password) | `FERRY_ETCD_USER`, `FERRY_ETCD_PASSWORD` |
///
/// See `docs/security.md`, "The control plane".
#[derive(Clone, Default)]
pub struct Config {
    secret: Option<Option<Arc<[u8]>>>,
    trusted_network: Option<bool>,
    token: Option<Option<String>>,
    nats: Option<NatsAuth>,
    etcd: Option<Option<EtcdUser>>,
}

/// An etcd user name and password.
#[derive(Clone)]
pub(crate) struct EtcdUser {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EtcdUser(<redacted>)")
    }
}

/// How a NATS connection authenticates to its server.
#[derive(Clone, Default)]
pub(crate) enum NatsAuth {
    #[default]
    None,
    UserPassword(String, String),
    Token(String),
    NKey(String),
    CredsFile(String),
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a secret, a token or a password.
        f.debug_struct("Config")
            .field("secret", &self.secret.as_ref().map(|s| s.is_some()))
            .field("trusted_network", &self.trusted_network)
            .field("bearer_token", &self.token.as_ref().map(|t| t.is_some()))
            .field("etcd_user", &self.etcd.as_ref().map(|u| u.is_some()))
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Nothing set: everything comes from the environment.
    pub fn new() -> Config {
        Config::default()
    }

    /// The deployment's secret (at least [`MIN_SECRET`] bytes; default
    /// `FERRY_SECRET`). With it, a fetch proves that it holds the secret,
    /// a publisher answers only such fetches, with the metadata encrypted
    /// and authenticated for that one request, and a fetch accepts nothing
    /// else. Both sides need the same secret.
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Config {
        self.secret = Some(Some(secret.as_ref().into()));
        self
    }

    /// No secret, whatever `FERRY_SECRET` says.
    pub fn without_secret(mut self) -> Config {
        self.secret = Some(None);
        self
    }

    /// Whether to serve metadata without a secret on an address that other
    /// hosts can reach (default: `FERRY_CONTROL_TRUSTED_NETWORK=1`, else
    /// no). Without a secret, whoever reaches the server can take the
    /// capabilities, so an [`HttpServer`](crate::HttpServer) binds only a
    /// loopback address and a [`NatsChannel`](crate::NatsChannel) publishes
    /// only to a server it reaches over loopback, unless the network is
    /// declared trusted here. With a secret this has no effect.
    pub fn trusted_network(mut self, trusted: bool) -> Config {
        self.trusted_network = Some(trusted);
        self
    }

    /// The HTTP bearer token (default: `FERRY_CONTROL_TOKEN`): a server
    /// answers only requests with `Authorization: Bearer <token>` (else
    /// `401`), and a client sends it. It travels in clear: alone it keeps
    /// out those who cannot see the traffic; the secret also keeps out
    /// those who can.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Config {
        self.token = Some(Some(token.into()));
        self
    }

    /// NATS user and password (default: `FERRY_NATS_USER` and
    /// `FERRY_NATS_PASSWORD`; a URL's `nats://user:pass@host` works too).
    pub fn nats_user_and_password(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Config {
        self.nats = Some(NatsAuth::UserPassword(user.into(), password.into()));
        self
    }

    /// NATS authentication token (default: `FERRY_NATS_TOKEN`).
    pub fn nats_token(mut self, token: impl Into<String>) -> Config {
        self.nats = Some(NatsAuth::Token(token.into()));
        self
    }

    /// NATS NKey seed, `SU...` (default: `FERRY_NATS_NKEY`).
    pub fn nats_nkey(mut self, seed: impl Into<String>) -> Config {
        self.nats = Some(NatsAuth::NKey(seed.into()));
        self
    }

    /// A NATS credentials file, user JWT and NKey seed (default:
    /// `FERRY_NATS_CREDS`).
    pub fn nats_credentials_file(mut self, path: impl Into<String>) -> Config {
        self.nats = Some(NatsAuth::CredsFile(path.into()));
        self
    }

    /// The etcd user and password (default: `FERRY_ETCD_USER` and
    /// `FERRY_ETCD_PASSWORD`), for an etcd with authentication enabled:
    /// an [`EtcdStore`](crate::EtcdStore) authenticates as this user and
    /// sends the token etcd gives it with every request. Like the bearer
    /// token, it travels in clear over `http://`.
    pub fn etcd_user_and_password(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Config {
        self.etcd = Some(Some(EtcdUser {
            name: user.into(),
            password: password.into(),
        }));
        self
    }

    /// The settings, the environment's where unset.
    pub(crate) fn resolve(&self) -> Result<Auth> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let secret = match &self.secret {
            Some(s) => s.clone(),
            None => env(SECRET_ENV).map(|s| Arc::from(s.as_bytes())),
        };
        if secret.as_ref().is_some_and(|s| s.len() < MIN_SECRET) {
            return Err(Error::Config(format!(
                "the shared secret must be at least {MIN_SECRET} bytes (use random bytes, \
                 e.g. 32 hexadecimal digits)"
            )));
        }
        let trusted_network = match self.trusted_network {
            Some(t) => t,
            None => env(TRUSTED_NETWORK_ENV).is_some_and(|v| v.trim() == "1"),
        };
        let token = match &self.token {
            Some(t) => t.clone(),
            None => env(TOKEN_ENV),
        };
        if let Some(t) = &token {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::Config(
                    "the bearer token must be printable ASCII without spaces".into(),
                ));
            }
        }
        let nats = match &self.nats {
            Some(n) => n.clone(),
            None => match (
                env(NATS_USER_ENV),
                env(NATS_PASSWORD_ENV),
                env(NATS_TOKEN_ENV),
                env(NATS_NKEY_ENV),
                env(NATS_CREDS_ENV),
            ) {
                (Some(u), p, None, None, None) => NatsAuth::UserPassword(u, p.unwrap_or_default()),
                (None, None, Some(t), None, None) => NatsAuth::Token(t),
                (None, None, None, Some(k), None) => NatsAuth::NKey(k),
                (None, None, None, None, Some(c)) => NatsAuth::CredsFile(c),
                (None, None, None, None, None) => NatsAuth::None,
                _ => {
                    return Err(Error::Config(format!(
                        "set one way for NATS to authenticate: {NATS_USER_ENV} and \
                         {NATS_PASSWORD_ENV}, or {NATS_TOKEN_ENV}, or {NATS_NKEY_ENV}, or \
                         {NATS_CREDS_ENV}"
                    )))
                }
            },
        };
        let etcd = match &self.etcd {
            Some(u) => u.clone(),
            None => env(ETCD_USER_ENV).map(|name| EtcdUser {
                name,
                password: env(ETCD_PASSWORD_ENV).unwrap_or_default(),
            }),
        };
        Ok(Auth {
            keys: secret.map(|s| Keys::derive(&s)),
            trusted_network,
            token,
            nats,
            etcd,
        })
    }
}

/// A [`Config`] resolved: what the server, client or channel uses.
#[derive(Clone)]
pub(crate) struct Auth {
    pub keys: Option<Keys>,
    pub trusted_network: bool,
    pub token: Option<String>,
    pub nats: NatsAuth,
    pub etcd: Option<EtcdUser>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a secret, a token or a password.
        f.debug_struct("Auth")
            .field("secret", &self.keys.is_some())
            .field("trusted_network", &self.trusted_network)
            .field("bearer_token", &self.token.is_some())
            .field("nats", &self.nats)
            .field("etcd", &self.etcd)
            .finish()
    }
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NatsAuth::None => "None",
            NatsAuth::UserPassword(..) => "UserPassword(<redacted>)",
            NatsAuth::Token(_) => "Token(<redacted>)",
            NatsAuth::NKey(_) => "NKey(<redacted>)",
            NatsAuth::CredsFile(_) => "CredsFile",
        })
    }
}

impl Auth {
    /// Whether metadata may be served without a secret to whoever reaches
    /// `ip`: with a secret, on loopback, or on a network declared trusted.
    pub(crate) fn may_serve_on(&self, ip: IpAddr) -> bool {
        self.keys.is_some() || self.trusted_network || is_loopback(ip)
    }
}

/// Loopback, IPv4-mapped IPv6 loopback included.
pub(crate) fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Compares a presented bearer token with the expected one in time that
/// does not depend on where they differ.
pub(crate) fn token_matches(presented: &[u8], expected: &str) -> bool {
    use subtle::ConstantTimeEq;
    presented.len() == expected.len() && bool::from(presented.ct_eq(expected.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_secret_is_ever_printed() {
        let c = Config::new()
            .secret("s3cr3t-0123456789abcdef")
            .bearer_token("t0k3n")
            .nats_user_and_password("us3r", "pa55")
            .etcd_user_and_password("r00t", "etcdpa55");
        let auth = c.resolve().unwrap();
        let client = crate::HttpClient::with_config("127.0.0.1:1", &c).unwrap();
        for printed in [format!("{c:?}"), format!("{auth:?}"), format!("{client:?}")] {
            for secret in ["s3cr3t", "t0k3n", "us3r", "pa55", "r00t", "etcdpa55"] {
                assert!(!printed.contains(secret), "{printed}");
            }
        }
    }

    #[test]
    fn short_secrets_and_bad_tokens_are_refused() {
        for c in [
            Config::new().secret("short"),
            Config::new().without_secret().bearer_token("has space"),
            Config::new().without_secret().bearer_token(""),
        ] {
            assert!(matches!(c.resolve(), Err(Error::Config(_))), "{c:?}");
        }
    }
}
