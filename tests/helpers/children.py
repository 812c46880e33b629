"""Child interpreters for tests, and the results they write (`clarifyjax.files.child_result`; a
child's stdout and stderr only go into failure messages): `run_child(argv)`,
`run_with_fake_devices(code, n)`, `run_processes(argv, n)` (one multi-process JAX job on
127.0.0.1, results by process id) and `run_launcher(argv, n)` (through
launch/local_multiprocess.sh)."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable, Sequence

from clarifyjax.files.child_result import RESULT_FILE_ENV, read_result, result_path
from helpers.env import REPO_ROOT
from helpers.compile_cache import inherited_xla_flags

TESTS = REPO_ROOT / "tests"
LAUNCH_VARS = ("CLARIFYJAX_COORDINATOR", "CLARIFYJAX_NUM_PROCESSES", "CLARIFYJAX_PROCESS_ID",
               "CLARIFYJAX_LOCAL_DEVICE_IDS", RESULT_FILE_ENV)
CLUSTER_PREFIXES = ("SLURM_", "OMPI_", "TPU_", "MEGASCALE_")
# What the JAX coordinator says when its port is taken (it then dies, often by SIGSEGV).
PORT_TAKEN = ("Failed to add port", "Address already in use")
PORT_ATTEMPTS = 4


def clean_env(**extra: str) -> dict:
    """This environment without launch or cluster variables (a CI runner may be a SLURM job), with
    the repository and tests/ importable (children use `helpers`), and `extra` on top."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith(CLUSTER_PREFIXES)}
    env["TPU_SKIP_MDS_QUERY"] = "1"  # no metadata-server probe: this is not a TPU VM
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(TESTS), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def fake_device_env(n_devices: int, **extra: str) -> dict:
    """`clean_env` with `n_devices` fake CPU devices (XLA_FLAGS must be set before jax is
    imported, hence children)."""
    return clean_env(XLA_FLAGS=inherited_xla_flags(n_devices), JAX_PLATFORMS="cpu", **extra)


def free_port() -> int:
    """A free TCP port below the kernel's ephemeral range, so that no outgoing connection can be
    given it between this check and the coordinator's bind; random, so that tests running at the
    same time rarely pick the same one (and `run_processes` retries when one does)."""
    low, high = 20000, 32768
    try:
        low_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        high = min(high, low_ephemeral)
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(100):
        port = random.randrange(low, high)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in [{low}, {high}) after 100 tries")


def _bindable(port: int) -> bool:
    """Whether `port` is free the way the coordinator binds it: [::]:port, dual stack (0.0.0.0
    where the machine has no IPv6)."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = ("::", port)
    except OSError:
        s, address = socket.socket(socket.AF_INET, socket.SOCK_STREAM), ("0.0.0.0", port)
    with s:
        try:
            s.bind(address)
        except OSError:
            return False
    return True


def _tail(text: str, n: int) -> str:
    return text[-n:] if text else ""


def child_failure(what: str, returncode, stdout: str, stderr: str, why: str) -> AssertionError:
    return AssertionError(f"{what}: {why} (exit status {returncode})\n"
                          f"--- stdout (tail) ---\n{_tail(stdout, 3000)}\n"
                          f"--- stderr (tail) ---\n{_tail(stderr, 5000)}")


def child_result(path: Path, returncode, stdout: str = "", stderr: str = "",
                 what: str = "child") -> dict:
    """The result at `path` of a child that exited with `returncode`; AssertionError with the
    child's output when it failed or wrote no (valid) result."""
    if returncode != 0:
        raise child_failure(what, returncode, stdout, stderr, "failed")
    try:
        return read_result(path)
    except (OSError, ValueError) as e:
        raise child_failure(what, returncode, stdout, stderr, f"no valid result file: {e}") from e


def _python(argv: str | Sequence) -> list[str]:
    return [sys.executable, "-c", argv] if isinstance(argv, str) else [str(a) for a in argv]


def run_child(argv: str | Sequence, *, env: dict | None = None, timeout: float = 600,
              cwd: Path | None = None) -> dict:
    """Run `argv` (a str: Python code) to completion, in `cwd` (default: the test's folder); return
    what it wrote with `write_result`."""
    with tempfile.TemporaryDirectory(prefix="child-") as tmp:
        path = Path(tmp) / "result.json"
        env = dict(clean_env() if env is None else env, **{RESULT_FILE_ENV: str(path)})
        try:
            proc = subprocess.run(_python(argv), env=env, cwd=cwd, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise child_failure("child", None, _text(e.stdout), _text(e.stderr),
                                f"timed out after {timeout} s") from e
        return child_result(path, proc.returncode, proc.stdout, proc.stderr)


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def killed_on_second_call(module: str, method: str, run: str) -> str:
    """Python code for a child that SIGKILLs itself the second time `module`'s `method` (e.g.
    "Clarifier.ask") is called, so that a batch job dies at a known point with its first chunk
    saved (no watcher racing the child's writes); `run` (code) is what it runs, e.g. a CLI."""
    owner, name = method.split(".")
    return f"""
import os, signal, sys
import {module} as patched
original, calls = patched.{owner}.{name}, []
def die_on_second(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, *args, **kwargs)
patched.{owner}.{name} = die_on_second
{run}
"""


def run_with_fake_devices(code: str, n_devices: int = 8, timeout: float = 600) -> dict:
    """Python `code` in a fresh interpreter with `n_devices` fake CPU devices -> its result."""
    return run_child(code, env=fake_device_env(n_devices), timeout=timeout)


def _port_taken(stderr: str) -> bool:
    return any(s in stderr for s in PORT_TAKEN)


def run_processes(argv: str | Sequence, n: int, *, n_devices: int = 4, timeout: float = 300,
                  env: Callable[[int, int], dict] | None = None) -> list[dict]:
    """`n` children as one JAX job on 127.0.0.1 (CLARIFYJAX_COORDINATOR / NUM_PROCESSES /
    PROCESS_ID, `n_devices` fake CPU devices each) -> their results, by process id.

    `env(process_id, port)`, if given, makes a child's environment instead. When one child fails
    the others are killed at once (they would wait for it until their own timeout). A run whose
    coordinator found its port taken (another test picked the same one) is retried on another."""
    for attempt in range(PORT_ATTEMPTS):
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="children-") as tmp:
            base = Path(tmp) / "result.json"
            procs, logs = [], []
            for i in range(n):
                child_env = env(i, port) if env else fake_device_env(
                    n_devices, CLARIFYJAX_COORDINATOR=f"127.0.0.1:{port}",
                    CLARIFYJAX_NUM_PROCESSES=str(n), CLARIFYJAX_PROCESS_ID=str(i))
                child_env[RESULT_FILE_ENV] = str(base)
                # files, not pipes: a child blocked on a full pipe would stall the collectives
                out, err = open(Path(tmp) / f"out.{i}", "w+"), open(Path(tmp) / f"err.{i}", "w+")
                logs.append((out, err))
                procs.append(subprocess.Popen(_python(argv), env=child_env, stdout=out, stderr=err))
            why = _wait_all(procs, timeout)
            outputs = []
            for out, err in logs:
                out.seek(0), err.seek(0)
                outputs.append((out.read(), err.read()))
                out.close(), err.close()
            if why and attempt + 1 < PORT_ATTEMPTS and any(_port_taken(e) for _, e in outputs):
                continue
            results = []
            for i, (p, (stdout, stderr)) in enumerate(zip(procs, outputs)):
                what = f"process {i} of {n} (port {port})"
                if why:
                    raise child_failure(what, p.returncode, stdout, stderr, why)
                results.append(child_result(result_path(base, i), p.returncode, stdout, stderr,
                                            what))
            return results
    raise AssertionError("unreachable")


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> str | None:
    """Wait for every process; on the first failure or at `timeout`, kill the rest. Returns why
    the run failed, or None."""
    deadline = time.monotonic() + timeout
    why = None
    while any(p.poll() is None for p in procs):
        failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed:
            why = f"process {failed[0]} exited with status {procs[failed[0]].returncode}"
        elif time.monotonic() > deadline:
            why = f"timed out after {timeout} s"
        if why:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.1)
    for p in procs:
        p.wait()
    if why is None and any(p.returncode != 0 for p in procs):
        bad = next(i for i, p in enumerate(procs) if p.returncode != 0)
        why = f"process {bad} exited with status {procs[bad].returncode}"
    return why


def run_launcher(argv: Sequence, n: int, *, n_devices: int = 4, timeout: float = 600,
                 env: dict | None = None) -> list[dict]:
    """`launch/local_multiprocess.sh n argv...` with `n_devices` fake CPU devices per process ->
    the results of the processes, by process id (retried on another port when the coordinator
    found its port taken)."""
    for attempt in range(PORT_ATTEMPTS):
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="launcher-") as tmp:
            base = Path(tmp) / "result.json"
            run_env = dict(clean_env() if env is None else env, PORT=str(port),
                           DEVICES_PER_PROCESS=str(n_devices), **{RESULT_FILE_ENV: str(base)})
            # the launch script adds the device count from DEVICES_PER_PROCESS
            run_env["XLA_FLAGS"] = inherited_xla_flags()
            try:
                proc = subprocess.run(["bash", str(REPO_ROOT / "launch" / "local_multiprocess.sh"),
                                       str(n), *map(str, argv)], env=run_env, capture_output=True, text=True,
                                      timeout=timeout)
            except subprocess.TimeoutExpired as e:
                raise child_failure("local_multiprocess.sh", None, _text(e.stdout),
                                    _text(e.stderr), f"timed out after {timeout} s") from e
            # the children's stderr reaches the launcher's stdout, prefixed
            if proc.returncode != 0 and attempt + 1 < PORT_ATTEMPTS and _port_taken(proc.stdout):
                continue
            return [child_result(result_path(base, i), proc.returncode, proc.stdout, proc.stderr,
                                 f"local_multiprocess.sh, process {i} of {n} (port {port})")
                    for i in range(n)]
    raise AssertionError("unreachable")
