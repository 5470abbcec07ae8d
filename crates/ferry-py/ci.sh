#!/usr/bin/env bash
# Builds the `ferry` Python package and runs its pytest suite.
#
# Run from anywhere; works from a fresh machine with Python >= 3.9, pip and a
# Rust toolchain. Creates a virtual environment in target-py/venv, installs
# maturin, numpy, pytest, mypy, pydantic and uvloop there (the tests need
# pydantic v2 and uvloop; the package itself depends on neither), builds the
# extension (release, with Cargo.lock as committed) into the environment,
# type-checks the package and runs the tests.
# Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

# The release build shares the workspace's target/ (what `cargo run --release`
# builds for the bench): the dependencies compile once for both.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
python="${PYTHON:-python3}"
venv="$root/target-py/venv"

if [ ! -x "$venv/bin/python" ]; then
    echo "== creating $venv"
    "$python" -m venv "$venv"
fi
echo "== pip install maturin numpy pytest mypy pydantic uvloop"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "maturin>=1.9.4,<2" numpy pytest mypy "pydantic>=2,<3" uvloop

echo "== maturin develop --release (crates/ferry-py)"
(cd crates/ferry-py && VIRTUAL_ENV="$venv" "$venv/bin/maturin" develop --release --locked --quiet)

echo "== mypy --strict (the package, its stubs and annotations)"
(cd crates/ferry-py/python && "$venv/bin/python" -m mypy --strict --no-incremental ferry)

echo "== pytest crates/ferry-py/tests"
"$venv/bin/python" -m pytest crates/ferry-py/tests -q -p no:cacheprovider

# The GPU tests once more against the fake CUDA driver (crates/fake-cuda,
# built by .ci/test before this runs): device memory behind
# __cuda_array_interface__ moved by CUDA IPC between two processes.
fake_cuda=$root/target/debug/libferry_fake_cuda.so
if [ -f "$fake_cuda" ]; then
    echo "== pytest: the GPU tests against the fake CUDA driver"
    FERRY_CUDA_LIB=$fake_cuda "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider \
        crates/ferry-py/tests/test_reference_examples.py \
        crates/ferry-py/tests/test_gpu_descriptors.py
else
    echo "(no $fake_cuda: cargo build -p ferry-fake-cuda runs the GPU tests against it)"
fi
