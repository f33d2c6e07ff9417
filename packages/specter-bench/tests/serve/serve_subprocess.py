"""``specter serve`` started as a subprocess for the tests that drive a real server."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import httpx
import pytest

START_TIMEOUT_S = 600


@contextlib.contextmanager
def serve_subprocess(
    options: Sequence[str], headers: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen, str, list[str]]]:
    """Run ``specter serve --device cpu --port 0 OPTIONS`` until the block ends.

    Yields ``(process, url, log)`` once ``/health`` answers 200; ``log`` keeps gathering the
    server's stderr (read on a thread, so the server never blocks on a full pipe). Fails the
    test with the log when the server exits or does not become healthy in time.
    """
    command = [sys.executable, "-m", "specter_bench", "serve", "--device", "cpu", "--port", "0"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([*command, *options], stderr=subprocess.PIPE, text=True, env=env)
    log: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            log.append(line)
            match = re.search(r"listening on (http://\S+)", line)
            if match and not url:
                url.append(match.group(1))
                found.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        assert found.wait(START_TIMEOUT_S), "".join(log)
        while time.monotonic() < deadline:
            assert process.poll() is None, "".join(log)
            try:
                if httpx.get(url[0] + "/health", headers=headers).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("the server did not become healthy:\n" + "".join(log))
        yield process, url[0], log
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
