//! `ferry status`: what this machine offers Ferry, as one short report:
//! the CUDA driver (and whether GPU memory can be lent by CUDA IPC), UCX
//! (the library, its transports, whether it moves CUDA memory), whether
//! the kernel lets processes attach to each other (cross-memory attach),
//! and the environment variables that change the choice of transport.
//! For a first look at a new host, and for bug reports.

/// The report, one `name: value` line each.
pub fn report() -> String {
    let mut lines = Vec::new();
    let mut line = |name: &str, value: String| lines.push(format!("{name:<22} {value}"));
    // What a library's status says it found, or why there is none.
    let found = |r: Result<String, String>| r.unwrap_or_else(|why| format!("unavailable: {why}"));
    line("cuda:", found(ferry::cuda::status()));
    line(
        "gpu memory:",
        if ferry::cuda::available() {
            "can be described and moved (CUDA IPC on one host, staged elsewhere)".into()
        } else {
            "refused (CudaUnavailable): no CUDA driver that sees a device".into()
        },
    );
    line("ucx:", found(ferry::ucx::status()));
    line(
        "ucx moves gpu memory:",
        format!(
            "{} ({}={})",
            if ferry::ucx::moves_cuda() {
                "yes"
            } else {
                "no"
            },
            ferry::ucx::CUDA_ENV,
            std::env::var(ferry::ucx::CUDA_ENV).unwrap_or_else(|_| "unset".into()),
        ),
    );
    line("cross-memory attach:", attach());
    for var in [
        ferry::TRANSPORTS_ENV,
        ferry::ucx::LIB_ENV,
        "FERRY_CUDA_LIB",
        "UCX_TLS",
    ] {
        if let Ok(v) = std::env::var(var) {
            line(&format!("{var}:"), v);
        }
    }
    if std::env::var_os(ferry::SECRET_ENV).is_some() {
        line(
            &format!("{}:", ferry::SECRET_ENV),
            "set (connections authenticated and encrypted)".into(),
        );
    }
    lines.join("\n")
}

/// What Yama's `ptrace_scope` lets cross-memory attach do here (Ferry
/// still probes each connection: a container's seccomp profile may refuse
/// it all the same).
fn attach() -> String {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope");
    match scope.as_deref().map(str::trim) {
        Ok("0") => "permitted between processes of one user (Yama ptrace_scope 0)".into(),
        Ok("1") => "only into descendant processes or with CAP_SYS_PTRACE (root) (Yama \
                    ptrace_scope 1): elsewhere the probe fails and one host moves over TCP"
            .into(),
        Ok("2") => "only as root or with CAP_SYS_PTRACE (Yama ptrace_scope 2)".into(),
        Ok("3") => "refused (Yama ptrace_scope 3): one host moves over TCP".into(),
        Ok(other) => format!("Yama ptrace_scope {other}"),
        Err(_) => "no Yama here: permitted between processes of one user".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line is there, and each says what it found or why not.
    #[test]
    fn the_report_names_cuda_ucx_and_attach() {
        let r = report();
        for name in [
            "cuda:",
            "gpu memory:",
            "ucx:",
            "ucx moves gpu memory:",
            "cross-memory attach:",
        ] {
            assert!(
                r.lines().any(|l| l.starts_with(name) && l.len() > 23),
                "no {name} line with a value in\n{r}"
            );
        }
        if !ferry::cuda::available() {
            assert!(r.contains("cuda:                  unavailable: "), "{r}");
            assert!(r.contains("refused (CudaUnavailable)"), "{r}");
        }
        if ferry::ucx::status().is_err() {
            assert!(r.contains("ucx:                   unavailable: "), "{r}");
        }
    }
}
