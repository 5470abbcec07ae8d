//! Resolution: builder over environment over default, and every malformed
//! value a typed error that names its variable.

use std::collections::HashMap;
use std::ffi::OsString;
use std::time::Duration;

use super::*;
use crate::ConnectorBuilder;

/// An environment of `vars` only.
fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    move |name| map.get(name).cloned()
}

fn resolve(b: ConnectorBuilder, vars: &[(&str, &str)]) -> Result<Config, SettingError> {
    Config::resolve_in(&b, &env(vars))
}

#[test]
fn the_builder_wins_over_the_environment_which_wins_over_the_default() {
    let vars = [(TCP_STREAMS_ENV, "8"), (CMA_THRESHOLD_ENV, " 4096 ")];
    let c = resolve(ConnectorBuilder::default().tcp_streams(2), &vars).unwrap();
    assert_eq!(c.tcp_streams.value, Some(2));
    assert_eq!(c.tcp_streams.origin, Origin::Builder);
    assert_eq!(c.cma_threshold.value, 4096);
    assert_eq!(c.cma_threshold.origin, Origin::Environment);
    assert_eq!(c.stripe_threshold.value, crate::DEFAULT_STRIPE_THRESHOLD);
    assert_eq!(c.stripe_threshold.origin, Origin::Default);
    assert!(!c.transports_named());
    // Set to blanks: unset.
    let c = resolve(ConnectorBuilder::default(), &[(TCP_STREAMS_ENV, "  ")]).unwrap();
    assert_eq!(c.tcp_streams.origin, Origin::Default);
}

/// The builder's strict registration holds without the variable, and over
/// a variable that says otherwise (the UCX context gets it from here:
/// `tests/ucx.rs` `strict_registration_by_the_builder_reaches_ucx`).
#[test]
fn a_builder_flag_is_not_overridden_by_the_environment() {
    let b = ConnectorBuilder::default().ucx_strict_registration(true);
    let c = resolve(b.clone(), &[]).unwrap();
    assert!(c.ucx_strict_registration.value);
    assert_eq!(c.ucx_strict_registration.origin, Origin::Builder);
    let c = resolve(b, &[(UCX_STRICT_REGISTRATION_ENV, "0")]).unwrap();
    assert!(c.ucx_strict_registration.value);
    let vars = [(UCX_TRUSTED_NETWORK_ENV, "1"), (UCX_EMULATED_RMA_ENV, "0")];
    let c = resolve(ConnectorBuilder::default(), &vars).unwrap();
    assert!(c.ucx_trusted_network.value && !c.ucx_emulated_rma.value);
    assert_eq!(c.ucx_emulated_rma.origin, Origin::Environment);
}

#[test]
fn a_malformed_variable_is_named_with_what_is_wrong() {
    let e = resolve(ConnectorBuilder::default(), &[(TCP_STREAMS_ENV, "many")]).unwrap_err();
    assert_eq!(
        e,
        SettingError {
            name: TCP_STREAMS_ENV,
            origin: Origin::Environment,
            value: Some("many".into()),
            problem: Problem::NotANumber("streams"),
        }
    );
    assert_eq!(
        e.to_string(),
        "FERRY_TCP_STREAMS=\"many\" is not a number of streams"
    );
    let cases: &[(&str, &str, Problem)] = &[
        (UCX_TRUSTED_NETWORK_ENV, "yes", Problem::NotAFlag),
        (
            TCP_STREAMS_ENV,
            "0",
            Problem::OutOfRange { min: 1, max: 16 },
        ),
        (IDLE_TIMEOUT_ENV, "0", Problem::NotPositive),
        (MAX_CONNECTIONS_ENV, "0", Problem::NotPositive),
        (ADMISSION_PREFIXES_ENV, "24", Problem::NotTwoPrefixes),
        (ADMISSION_PREFIXES_ENV, "33,64", Problem::PrefixTooLong),
        (METRICS_ADDR_ENV, "here", Problem::NotAnAddress),
        (
            TRANSPORTS_ENV,
            "tcp,rdma",
            Problem::UnknownTransport("rdma".into()),
        ),
        (TRANSPORTS_ENV, "cma", Problem::NoTcp),
    ];
    for (name, value, problem) in cases {
        let e = resolve(ConnectorBuilder::default(), &[(name, value)]).unwrap_err();
        assert_eq!((e.name, &e.problem), (*name, problem), "{name}={value}");
        assert_eq!(e.origin, Origin::Environment);
        assert!(e.to_string().starts_with(name), "{e}");
        assert_eq!(e.value.as_deref(), Some(*value), "{e}");
    }
}

#[test]
fn a_bad_builder_setting_names_the_method_and_never_shows_a_secret() {
    let e = resolve(ConnectorBuilder::default().tcp_streams(0), &[]).unwrap_err();
    assert_eq!(e.origin, Origin::Builder);
    assert_eq!(
        e.to_string(),
        "ConnectorBuilder::tcp_streams (0) must be 1 to 16"
    );
    let e = resolve(ConnectorBuilder::default().secret("hunter2"), &[]).unwrap_err();
    assert_eq!(e.problem, Problem::TooShort(crate::MIN_SECRET));
    assert!(!e.to_string().contains("hunter2"), "{e}");
    let e = resolve(ConnectorBuilder::default(), &[(SECRET_ENV, "hunter2")]).unwrap_err();
    assert_eq!((e.origin, &e.value), (Origin::Environment, &None));
    assert!(e.to_string().starts_with("FERRY_SECRET is shorter"), "{e}");
    assert!(resolve(ConnectorBuilder::default().admission_prefixes(32, 128), &[]).is_ok());
    let e = resolve(ConnectorBuilder::default().admission_prefixes(24, 129), &[]).unwrap_err();
    assert_eq!(e.problem, Problem::PrefixTooLong);
    let e = resolve(
        ConnectorBuilder::default().idle_timeout(Duration::ZERO),
        &[],
    )
    .unwrap_err();
    assert_eq!(e.problem, Problem::NotPositive);
}

#[test]
fn admission_prefixes_are_two_lengths() {
    use connector::parse_prefixes;
    assert_eq!(parse_prefixes(" 24, 64 "), Some((24, 64)));
    assert_eq!(parse_prefixes("16,48"), Some((16, 48)));
    for bad in ["24", "24;64", "a,64", "24,64,1", "-1,64", "300,64"] {
        assert_eq!(parse_prefixes(bad), None, "{bad}");
    }
}

#[test]
fn every_connector_knob_is_listed_with_its_origin() {
    let secret = "0123456789abcdef0123";
    let vars = [(SECRET_ENV, secret), (TRANSPORTS_ENV, "cma,tcp")];
    let c = resolve(ConnectorBuilder::default().max_connections(7), &vars).unwrap();
    assert!(c.transports_named());
    let knobs = c.knobs();
    let names: Vec<_> = knobs.iter().map(|k| k.name).collect();
    for name in [
        TRANSPORTS_ENV,
        SECRET_ENV,
        CMA_THRESHOLD_ENV,
        TCP_STREAMS_ENV,
        STRIPE_THRESHOLD_ENV,
        IDLE_TIMEOUT_ENV,
        MAX_CONNECTIONS_ENV,
        ADMISSION_PREFIXES_ENV,
        METRICS_ADDR_ENV,
        UCX_EMULATED_RMA_ENV,
        UCX_STRICT_REGISTRATION_ENV,
        UCX_TRUSTED_NETWORK_ENV,
        LIVENESS_ENV,
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
        assert!(names::builder_method(name).is_some(), "{name}");
    }
    let get = |n: &str| knobs.iter().find(|k| k.name == n).unwrap().clone();
    assert_eq!(get(TRANSPORTS_ENV).value, "cma,tcp");
    assert_eq!(get(TRANSPORTS_ENV).origin, Origin::Environment);
    assert_eq!(get(MAX_CONNECTIONS_ENV).value, "7");
    assert_eq!(get(MAX_CONNECTIONS_ENV).origin, Origin::Builder);
    assert_eq!(get(IDLE_TIMEOUT_ENV).origin, Origin::Default);
    assert!(!get(SECRET_ENV).value.contains(secret));
}

#[test]
fn process_knobs_are_read_once_and_checked() {
    let vars = [
        (CMA_THREADS_ENV, "2"),
        (CMA_PROBE_TIMEOUT_ENV, "250"),
        (UCX_CUDA_ENV, "1"),
        (UCX_LIB_ENV, "/opt/ucx/lib"),
        (CUDA_LIB_ENV, ""),
        ("VIRTUAL_ENV", "/venv"),
        ("HOME", "/home/u"),
    ];
    let p = ProcessConfig::read(&env(&vars));
    assert!(p.check().is_ok());
    assert_eq!(p.cma_threads.value, 2);
    assert_eq!(p.probe_timeout.value, Duration::from_millis(250));
    assert_eq!(p.probe_timeout.origin, Origin::Environment);
    assert_eq!(p.probe_files.value, DEFAULT_PROBE_FILES);
    assert_eq!(p.probe_files.origin, Origin::Default);
    assert!(p.ucx_cuda.value);
    assert_eq!(
        p.ucx_lib.value.as_deref(),
        Some(std::path::Path::new("/opt/ucx/lib"))
    );
    // Set to nothing: searched as if unset.
    assert_eq!(p.cuda_lib.value, None);
    assert_eq!(
        p.python_lib_roots,
        [
            std::path::PathBuf::from("/venv/lib"),
            "/home/u/.local/lib".into()
        ]
    );
    assert_eq!(p.knobs().len(), 7);
    assert!(!p.lane_on("procmem"), "lanes off by default stay off");
    let on = ProcessConfig::read(&|n: &str| {
        (n == LANES_ON_ENV).then(|| std::ffi::OsString::from(" procmem, other ,"))
    });
    assert!(on.lane_on("procmem") && on.lane_on("other") && !on.lane_on(""));

    // Malformed: the default is used, and building a connector fails.
    let bad = [
        (CMA_THREADS_ENV, "0"),
        (CMA_PROBE_FILES_ENV, "lots"),
        (UCX_CUDA_ENV, "on"),
    ];
    let p = ProcessConfig::read(&env(&bad));
    let problems: Vec<_> = p
        .problems
        .iter()
        .map(|e| (e.name, e.problem.clone()))
        .collect();
    assert_eq!(
        problems,
        [
            (UCX_CUDA_ENV, Problem::NotAFlag),
            (CMA_THREADS_ENV, Problem::NotPositive),
            (CMA_PROBE_FILES_ENV, Problem::NotANumber("files")),
        ]
    );
    assert_eq!(p.check().unwrap_err().name, UCX_CUDA_ENV);
    assert_eq!(p.probe_files.value, DEFAULT_PROBE_FILES);
    assert!(!p.ucx_cuda.value);
    let p = ProcessConfig::read(&env(&[(CMA_THREADS_ENV, "65")]));
    assert_eq!(
        p.problems[0].problem,
        Problem::OutOfRange { min: 1, max: 64 }
    );
}

#[tokio::test]
async fn a_connector_reports_the_configuration_it_runs_with() {
    let c = ConnectorBuilder::default()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[crate::TransportKind::Tcp])
        .idle_timeout(Duration::from_secs(9))
        .build()
        .await
        .unwrap();
    let knobs = c.configuration();
    let get = |n: &str| knobs.iter().find(|k| k.name == n).unwrap().clone();
    assert_eq!(get(IDLE_TIMEOUT_ENV).value, "9 s");
    assert_eq!(get(IDLE_TIMEOUT_ENV).origin, Origin::Builder);
    assert_eq!(get(TRANSPORTS_ENV).value, "tcp");
    assert_eq!(get(CMA_THREADS_ENV).name, CMA_THREADS_ENV);
    assert_eq!(knobs.len(), 21);
}

/// The liveness bound: milliseconds in the variable, `0` off, the builder
/// first, 1.5 s by default.
#[test]
fn the_liveness_bound_resolves_and_shows() {
    let show = |c: &Config| {
        let k = c.knobs();
        k.iter()
            .find(|k| k.name == LIVENESS_ENV)
            .unwrap()
            .value
            .clone()
    };
    let c = resolve(ConnectorBuilder::default(), &[]).unwrap();
    assert_eq!(c.liveness.value, Duration::from_millis(1500));
    assert_eq!(c.liveness.origin, Origin::Default);
    assert_eq!(show(&c), "1500 ms");
    let c = resolve(ConnectorBuilder::default(), &[(LIVENESS_ENV, "250")]).unwrap();
    assert_eq!(c.liveness.value, Duration::from_millis(250));
    assert_eq!(c.liveness.origin, Origin::Environment);
    let c = resolve(ConnectorBuilder::default(), &[(LIVENESS_ENV, "0")]).unwrap();
    assert_eq!(show(&c), "off");
    let b = ConnectorBuilder::default().liveness(Duration::from_secs(3));
    let c = resolve(b, &[(LIVENESS_ENV, "250")]).unwrap();
    assert_eq!(c.liveness.value, Duration::from_secs(3));
    assert_eq!(c.liveness.origin, Origin::Builder);
    let e = resolve(ConnectorBuilder::default(), &[(LIVENESS_ENV, "soon")]).unwrap_err();
    assert!(e.to_string().contains(LIVENESS_ENV), "{e}");
}

#[test]
fn the_digest_is_off_by_default_and_named_by_a_flag_or_its_algorithm() {
    let c = resolve(ConnectorBuilder::default(), &[]).unwrap();
    assert!(!c.digest.value);
    assert_eq!(c.digest.origin, Origin::Default);
    for (v, on) in [("1", true), ("crc32", true), ("0", false)] {
        let c = resolve(ConnectorBuilder::default(), &[(DIGEST_ENV, v)]).unwrap();
        assert_eq!(
            (c.digest.value, c.digest.origin),
            (on, Origin::Environment),
            "{v}"
        );
    }
    let b = ConnectorBuilder::default().digest(false);
    let c = resolve(b, &[(DIGEST_ENV, "1")]).unwrap();
    assert_eq!((c.digest.value, c.digest.origin), (false, Origin::Builder));
    let e = resolve(ConnectorBuilder::default(), &[(DIGEST_ENV, "xxh3")]).unwrap_err();
    assert_eq!((e.name, e.problem), (DIGEST_ENV, Problem::NotAFlag));
    let shown = resolve(ConnectorBuilder::default(), &[(DIGEST_ENV, "1")])
        .unwrap()
        .knobs();
    assert!(shown
        .iter()
        .any(|k| format!("{k:?}").contains("FERRY_DIGEST")));
}
