//! [`ProcessConfig`]: the knobs that hold for the whole process, read once.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use super::names::*;
use super::{flag, number, Env, Knob, Origin, Problem, Setting, SettingError};

/// Cross-memory attach probes may take this long by default.
pub(crate) const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// A probe examines at most this many open files of the claimed process by
/// default.
pub(crate) const DEFAULT_PROBE_FILES: usize = 1024;
/// The most threads one cross-memory pull uses by default.
pub(crate) const DEFAULT_MAX_CMA_THREADS: usize = 4;
/// The most threads `FERRY_CMA_THREADS` may name.
const MAX_CMA_THREADS: usize = 64;

/// What holds for the whole process and no builder sets: which native
/// libraries to load, whether UCX moves CUDA memory, how many threads copy
/// a cross-memory pull, the bounds of a cross-memory attach probe. Read
/// from the environment the first time it is asked for ([`process`]).
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// `FERRY_UCX_LIB`: the `libucp` to load (a file or its directory).
    pub(crate) ucx_lib: Setting<Option<PathBuf>>,
    /// Where a PyPI `libucx` may be installed: the `lib` folders of
    /// `VIRTUAL_ENV` and `CONDA_PREFIX`, and `~/.local/lib`.
    pub(crate) python_lib_roots: Vec<PathBuf>,
    /// `FERRY_CUDA_LIB`: the CUDA driver library to load.
    pub(crate) cuda_lib: Setting<Option<OsString>>,
    /// `FERRY_UCX_CUDA`: UCX may move CUDA memory here.
    pub(crate) ucx_cuda: Setting<bool>,
    /// `FERRY_UCX_STRICT_REGISTRATION` as the environment says it, for a
    /// UCX context started before any connector asked for one.
    pub(crate) ucx_strict_registration: Setting<bool>,
    /// `FERRY_CMA_THREADS`: threads of the process that may copy pulls.
    pub(crate) cma_threads: Setting<usize>,
    /// `FERRY_CMA_PROBE_TIMEOUT_MS`.
    pub(crate) probe_timeout: Setting<Duration>,
    /// `FERRY_CMA_PROBE_FILES`.
    pub(crate) probe_files: Setting<usize>,
    /// `FERRY_LANES_ON`: the names of lanes that are off by default and
    /// turned on here (a lane asks with [`lane_on`](Self::lane_on)).
    pub(crate) lanes_on: Setting<Vec<String>>,
    /// Malformed values (their defaults are used instead): building a
    /// connector fails with the first.
    pub(crate) problems: Vec<SettingError>,
}

/// `r`'s value; its error joins `problems` (and the default is used).
fn keep<T>(problems: &mut Vec<SettingError>, r: Result<Option<T>, SettingError>) -> Option<T> {
    r.unwrap_or_else(|e| {
        problems.push(e);
        None
    })
}

/// A number of `unit` from `name`, 1 to `max`, if set; a malformed one
/// joins `problems`.
fn positive(
    problems: &mut Vec<SettingError>,
    env: Env<'_>,
    name: &'static str,
    unit: &'static str,
    max: u64,
) -> Option<u64> {
    match keep(problems, number::<u64>(env, name, unit))? {
        n if n == 0 || n > max => {
            problems.push(SettingError {
                name,
                origin: Origin::Environment,
                value: Some(n.to_string()),
                problem: if n == 0 {
                    Problem::NotPositive
                } else {
                    Problem::OutOfRange { min: 1, max }
                },
            });
            None
        }
        n => Some(n),
    }
}

/// The process's configuration, read from the environment on first use.
pub fn process() -> &'static ProcessConfig {
    static PROCESS: OnceLock<ProcessConfig> = OnceLock::new();
    PROCESS.get_or_init(|| {
        let p = ProcessConfig::read(&super::process_env);
        for e in &p.problems {
            tracing::warn!("{e}: the default is used");
        }
        p
    })
}

impl ProcessConfig {
    /// Reads every process-wide knob from `env`.
    pub(crate) fn read(env: Env<'_>) -> ProcessConfig {
        let mut problems = Vec::new();
        let path = |name: &str| env(name).filter(|v| !v.is_empty());
        let ucx_cuda = keep(&mut problems, flag(env, UCX_CUDA_ENV));
        let strict = keep(&mut problems, flag(env, UCX_STRICT_REGISTRATION_ENV));
        let threads = positive(
            &mut problems,
            env,
            CMA_THREADS_ENV,
            "threads",
            MAX_CMA_THREADS as u64,
        );
        let timeout = positive(
            &mut problems,
            env,
            CMA_PROBE_TIMEOUT_ENV,
            "milliseconds",
            u64::MAX,
        );
        let files = positive(&mut problems, env, CMA_PROBE_FILES_ENV, "files", u64::MAX);
        let lanes_on = env(LANES_ON_ENV).map(|v| {
            v.to_string_lossy()
                .split(',')
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect::<Vec<_>>()
        });
        let default_threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(DEFAULT_MAX_CMA_THREADS);
        let mut python_lib_roots = Vec::new();
        for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            if let Some(v) = env(var) {
                python_lib_roots.push(PathBuf::from(v).join("lib"));
            }
        }
        if let Some(home) = env("HOME") {
            python_lib_roots.push(PathBuf::from(home).join(".local/lib"));
        }
        ProcessConfig {
            ucx_lib: Setting::pick(None, path(UCX_LIB_ENV).map(|v| Some(v.into())), None),
            python_lib_roots,
            cuda_lib: Setting::pick(None, path(CUDA_LIB_ENV).map(Some), None),
            ucx_cuda: Setting::pick(None, ucx_cuda, false),
            ucx_strict_registration: Setting::pick(None, strict, false),
            cma_threads: Setting::pick(None, threads.map(|n| n as usize), default_threads),
            probe_timeout: Setting::pick(
                None,
                timeout.map(Duration::from_millis),
                DEFAULT_PROBE_TIMEOUT,
            ),
            probe_files: Setting::pick(
                None,
                files.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                DEFAULT_PROBE_FILES,
            ),
            lanes_on: Setting::pick(None, lanes_on, Vec::new()),
            problems,
        }
    }

    /// Whether the lane named `name`, off by default, is turned on
    /// (`FERRY_LANES_ON`).
    pub fn lane_on(&self, name: &str) -> bool {
        self.lanes_on.value.iter().any(|n| n == name)
    }

    /// The first malformed value of the process's knobs, if any.
    pub fn check(&self) -> Result<(), SettingError> {
        match self.problems.first() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Every process-wide knob: its variable, its value, where it came
    /// from.
    pub fn knobs(&self) -> Vec<Knob> {
        let yes_no = |b: &bool| if *b { "yes" } else { "no" }.to_string();
        vec![
            self.ucx_lib.knob(UCX_LIB_ENV, |p| match p {
                Some(p) => p.display().to_string(),
                None => "searched (the system's libucp.so.0, then PyPI's libucx)".into(),
            }),
            self.cuda_lib.knob(CUDA_LIB_ENV, |p| match p {
                Some(p) => PathBuf::from(p).display().to_string(),
                None => "searched (libcuda.so.1, then libcuda.so)".into(),
            }),
            self.ucx_cuda.knob(UCX_CUDA_ENV, yes_no),
            self.cma_threads.knob(CMA_THREADS_ENV, |n| n.to_string()),
            self.probe_timeout
                .knob(CMA_PROBE_TIMEOUT_ENV, |d| format!("{} ms", d.as_millis())),
            self.probe_files
                .knob(CMA_PROBE_FILES_ENV, |n| n.to_string()),
            self.lanes_on.knob(LANES_ON_ENV, |l| {
                if l.is_empty() {
                    "none".into()
                } else {
                    l.join(",")
                }
            }),
        ]
    }
}
