"""Test plumbing: run countersign's binary, talk HTTP with urllib, collect results.

Nothing here knows countersign's internals; it drives the binary the way a user would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

LISTENING = re.compile(r"^countersign \S+ listening on (http://\S+) ")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for countersign child processes.

    countersign refuses unknown COUNTERSIGN_* variables (COUNTERSIGN_BIN, which this suite
    reads, is one), and COUNTERSIGN_CONFIG / COUNTERSIGN_DATA_DIR from the caller's shell
    would make the run depend on the machine. So all COUNTERSIGN_* variables are dropped,
    except COUNTERSIGN_LOG (handy when debugging a failure).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("COUNTERSIGN_") or k == "COUNTERSIGN_LOG"
    }
    env.update(extra or {})
    return env


def run_cli(binary: str, *args: str, timeout: float = 30) -> str:
    """Runs `countersign ARGS` and returns its stdout; raises with stderr on failure."""
    proc = subprocess.run(
        [binary, *args],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"`countersign {' '.join(args)}` exited {proc.returncode}\nstderr: {proc.stderr.strip()}"
        )
    return proc.stdout


def create_token(binary: str, data_dir: Path, role: str, name: str) -> str:
    out = run_cli(binary, "token", "create", "--role", role, "--name", name, "--data-dir", str(data_dir))
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, f"`token create` must print the token alone on stdout, printed {out!r}"
    return lines[0].strip()


class Server:
    """`countersign serve --listen 127.0.0.1:0` in a data directory."""

    def __init__(self, binary: str, data_dir: Path):
        self.binary = binary
        self.data_dir = data_dir
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.log: list[str] = []
        self._ready = threading.Event()

    def start(self, timeout: float = 30) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(self.data_dir)],
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(timeout) or not self.base_url:
            self.stop()
            raise RuntimeError(
                f"countersign serve printed no 'listening on' line within {timeout}s; its stderr:\n"
                + "\n".join(self.log)
            )

    def _drain(self) -> None:
        assert self.proc and self.proc.stderr
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.log.append(line)
            match = LISTENING.match(line)
            if match and not self.base_url:
                self.base_url = match.group(1)
                self._ready.set()
        self._ready.set()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    method: str,
    url: str,
    body: Any = None,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Response:
    """One HTTP request with urllib; any status comes back as a Response, never raised."""
    data = None
    hdrs = {"Accept": "application/json"}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
        hdrs["Content-Type"] = "application/json"
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    hdrs.update(headers or {})
    request = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return Response(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        return Response(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


@dataclass
class Context:
    """Everything a test needs to reach the server under test."""

    binary: str
    data_dir: Path
    base_url: str
    agent_token: str
    approver_token: str
    agent_name: str
    approver_name: str
    scratch: Path

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path

    def approve(self, request_id: str, **extra: Any) -> Response:
        return http(
            "POST",
            self.url(f"/api/v1/requests/{request_id}/decision"),
            {"decision": "approved", **extra},
            token=self.approver_token,
        )


@dataclass
class Results:
    passed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    xfailed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _one(self, name: str, fn: Callable[[], Any]) -> None:
        started = time.monotonic()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
            detail = "".join(traceback.format_exception(e))
            causes = "".join(f"  cause: {type(x).__name__}: {x}\n" for x in leaf_exceptions(e))
            detail = causes + detail
            self.failed.append((name, detail))
            print(f"FAIL {name} ({time.monotonic() - started:.1f}s)\n{detail}", flush=True)
        else:
            self.passed.append(name)
            print(f"ok   {name} ({time.monotonic() - started:.1f}s)", flush=True)

    def run(self, name: str, fn: Callable[[], Any]) -> None:
        print(f"--- {name}", flush=True)
        self._one(name, fn)

    def run_parallel(self, tests: list[tuple[str, Callable[[], Any]]]) -> None:
        """Tests that mostly wait (for a human, here a timer) run side by side, each in its
        own thread and event loop, each reported on its own."""
        print("--- " + " | ".join(name for name, _ in tests) + " (in parallel)", flush=True)
        threads = [threading.Thread(target=self._one, args=(name, fn)) for name, fn in tests]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def xfail(self, text: str) -> None:
        self.xfailed.append(text)
        print(f"XFAIL (known bug) {text}", flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"NOTE {text}", flush=True)


def leaf_exceptions(e: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, which anyio wraps failures in."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in leaf_exceptions(sub)]
    return [e]


def check(condition: Any, message: str) -> None:
    """An assert that survives `python -O`."""
    if not condition:
        raise AssertionError(message)


def eprint(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)
