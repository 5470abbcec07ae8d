//! Facts about this host and this process.

use ferry_proto::Token;

/// The host name, for information only.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 256)
        .unwrap_or_else(|| "localhost".to_string())
}

/// An identity of the running kernel: equal for two processes exactly when
/// they run on the same host (containers included). Falls back to a random
/// value, which makes every peer look remote — slower, never wrong.
pub(crate) fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 256)
        .unwrap_or_else(|| format!("random-{}", hex(&random_bytes())))
}

/// A random id of this process, the same for all its connectors.
pub(crate) fn process_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| hex(&random_bytes()))
}

/// 16 bytes from the operating system's secure random source.
pub(crate) fn random_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the operating system's random source failed");
    b
}

pub(crate) fn random_token() -> Token {
    Token::from_bytes(random_bytes())
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
