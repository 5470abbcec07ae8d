//! `ferry status`: what this machine offers Ferry, as one short report:
//! the CUDA driver (and whether GPU memory can be lent by CUDA IPC), UCX
//! (the library, its transports, whether it moves CUDA memory), whether
//! the kernel lets processes attach to each other (cross-memory attach),
//! and the configuration a connector of this process would get: every
//! knob, its value, and where it came from (default or environment; a
//! program's builder settings come on top, see `Connector::configuration`).
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
        if ferry::ucx::moves_cuda() {
            "yes"
        } else {
            "no"
        }
        .into(),
    );
    line("cross-memory attach:", attach());
    if let Ok(v) = std::env::var("UCX_TLS") {
        line("UCX_TLS:", v);
    }
    lines.push("configuration (value, and where it came from):".into());
    let process = ferry::config::process();
    let knobs = ferry::config::Config::resolve(&ferry::ConnectorBuilder::default())
        .and_then(|c| process.check().map(|()| c.knobs()));
    match knobs {
        Ok(knobs) => {
            for k in knobs.into_iter().chain(process.knobs()) {
                lines.push(format!("  {:<30} {} ({})", k.name, k.value, k.origin));
            }
        }
        Err(e) => lines.push(format!("  invalid: {e}")),
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
        // Every knob, with its value and where it came from.
        for name in [
            ferry::TRANSPORTS_ENV,
            ferry::SECRET_ENV,
            ferry::UCX_STRICT_REGISTRATION_ENV,
            ferry::CMA_THREADS_ENV,
            ferry::ucx::LIB_ENV,
        ] {
            let knob = format!("  {name} ");
            assert!(
                r.lines().any(|l| l.starts_with(&knob)
                    && (l.ends_with("(default)") || l.ends_with("(environment)"))),
                "no {name} line in\n{r}"
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
