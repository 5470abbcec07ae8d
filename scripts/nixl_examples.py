#!/usr/bin/env python3
"""Runs NIXL's own Python examples on ``ferry.nixl``, with only their
imports changed (issue 36).

NIXL's examples (``examples/python/`` of ai-dynamo/nixl) are not part of
this repository: point ``--examples`` at that directory of a NIXL checkout.
They need torch, which CI's machine does not have, so this script is run
by hand, with a Python that has torch and numpy (NIXL's PyPI package
``nixl-cu12`` brings both)::

    python3 scripts/nixl_examples.py --examples ~/nixl/examples/python \\
        --python /path/to/venv-with-torch/bin/python

Each example is copied to a temporary directory and its ``nixl`` imports
are rewritten to ``ferry.nixl`` (nothing else changes: the script prints
the lines it changed). The package comes from ``crates/ferry-py/python``
(build the extension there first: ``crates/ferry-py/ci.sh``, or ``maturin
develop``). It runs:

- ``basic_two_peers.py``: a target and an initiator process through the
  metadata listeners; READ with a notification, bytes checked;
- ``expanded_two_peers.py``: the same two processes; prepared READs,
  WRITEs from lists and arrays of descriptors, READs re-posted with new
  notifications, bytes checked on both sides;
- ``partial_md_example.py``: two agents in one process, partial metadata
  sent twice, a transfer refused before the second part arrived; with
  ``--etcd URL`` once more with ``--etcd``, its metadata through that etcd
  (NIXL's central store: ``NIXL_ETCD_ENDPOINTS``).

An example passes when every process exits 0 and prints the lines that
say its checks passed. The script exits non-zero if any fails. (The other
examples there move files and storage, GPUDirect Storage or NIXL's
telemetry files: not what ``ferry.nixl`` stands in for.)
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "crates", "ferry-py", "python")

# Only `import nixl...` and `from nixl... import` lines change.
IMPORT = re.compile(r"^(\s*)(from|import)\s+nixl(\.|\s)")

# Logging at INFO to stdout, then the example as __main__ (what NIXL's CI
# does with its logger configuration).
RUNNER = (
    "import logging, runpy, sys\n"
    "logging.basicConfig(level=logging.INFO, format='%(name)s %(levelname)s %(message)s', stream=sys.stdout)\n"
    "script = sys.argv[1]\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(script, run_name='__main__')\n"
)

# What each example prints when its checks passed, per process.
EXPECT = {
    "basic_two_peers.py": {"target": ["Test Complete."], "initiator": ["Data verification passed", "Test Complete."]},
    "expanded_two_peers.py": {
        "target": ["Target data verification passed"],
        "initiator": ["Initiator final data verification passed"],
    },
    "partial_md_example.py": {"": ["Correct exception", "Test Complete."]},
}


def rewrite(src: str, dst: str) -> List[str]:
    """Copies `src` to `dst` with its nixl imports made ferry.nixl ones;
    the changed lines."""
    changed = []
    out = []
    with open(src) as f:
        for line in f:
            if IMPORT.match(line):
                new = IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} ferry.nixl{m.group(3)}", line)
                changed.append(f"{line.rstrip()}  ->  {new.strip()}")
                line = new
            out.append(line)
    with open(dst, "w") as f:
        f.writelines(out)
    return changed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(python: str, runner: str, script: str, args: List[str], env: Dict[str, str], timeout: float) -> Tuple[int, str]:
    p = subprocess.run(
        [python, runner, script] + args, capture_output=True, text=True, timeout=timeout, env=env
    )
    return p.returncode, p.stdout + p.stderr


def check(name: str, role: str, rc: int, out: str) -> Optional[str]:
    if rc != 0:
        return f"{name} {role or 'process'} exited {rc}:\n{out[-3000:]}"
    for want in EXPECT[name][role]:
        if want not in out:
            return f"{name} {role or 'process'} did not print {want!r}:\n{out[-3000:]}"
    return None


def two_peers(python: str, runner: str, script: str, name: str, env: Dict[str, str]) -> Optional[str]:
    port = free_port()
    common = ["--ip", "127.0.0.1", "--port", str(port)]
    target = subprocess.Popen(
        [python, runner, script, "--mode", "target"] + common,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        # The target listens once its agent exists; the initiator's first
        # fetch retries until it answers.
        rc, out = run(python, runner, script, ["--mode", "initiator"] + common, env, 120)
        err = check(name, "initiator", rc, out)
        t_out, _ = target.communicate(timeout=60)
        return err or check(name, "target", target.returncode, t_out)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", required=True, help="examples/python of a NIXL checkout")
    ap.add_argument("--python", default=sys.executable, help="a Python with torch and numpy")
    ap.add_argument("--etcd", default="", help="an etcd (http://host:2379) for partial_md_example.py --etcd")
    args = ap.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE + os.pathsep + env.get("PYTHONPATH", "")
    # partial_md_example.py reads both (and deletes the second).
    env.setdefault("NIXL_PLUGIN_DIR", "(none: ferry.nixl)")
    env.setdefault("NIXL_ETCD_ENDPOINTS", "")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        runner = os.path.join(tmp, "run_example.py")
        with open(runner, "w") as f:
            f.write(RUNNER)
        for name in EXPECT:
            src = os.path.join(args.examples, name)
            if not os.path.exists(src):
                failed.append(f"{name}: not found in {args.examples}")
                continue
            dst = os.path.join(tmp, name)
            print(f"== {name}: imports changed:")
            for c in rewrite(src, dst):
                print(f"   {c}")
            if "" in EXPECT[name]:
                rc, out = run(args.python, runner, dst, [], env, 120)
                err = check(name, "", rc, out)
                if not err and args.etcd:
                    print("   passed; again with --etcd")
                    rc, out = run(args.python, runner, dst, ["--etcd"], {**env, "NIXL_ETCD_ENDPOINTS": args.etcd}, 120)
                    err = check(name, "", rc, out)
            else:
                err = two_peers(args.python, runner, dst, name, env)
            print(f"   {'FAILED' if err else 'passed'}")
            if err:
                failed.append(err)
    if failed:
        print("\n".join(failed), file=sys.stderr)
        sys.exit(1)
    print("every example passed on ferry.nixl")


if __name__ == "__main__":
    main()
