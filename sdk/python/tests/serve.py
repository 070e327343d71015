"""Starts `moehost serve` for the tests: MOEHOST_BIN names the binary
(make test-python builds it)."""

import os
import re
import subprocess
import tempfile
import threading
import time


def add_tenant(tenants: str, name: str, prefix: str) -> str:
    """Adds a tenant to the tenants file with `moehost tenant add` (without
    $MOEHOST_TOKEN) and returns its token."""
    env = {k: v for k, v in os.environ.items() if k != "MOEHOST_TOKEN"}
    out = subprocess.run([os.environ.get("MOEHOST_BIN", "moehost"), "tenant", "add", name, "--prefix", prefix,
                          "--tenants", tenants], env=env, check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


class Server:
    """A `moehost serve` on a free loopback port, with its own data dir.

    ``addr`` is its host:port; ``peer_id`` its DHT node's id, from its log
    ("" with --no-dht). ``stop()`` ends it.
    """

    def __init__(self, *args: str):
        binary = os.environ.get("MOEHOST_BIN", "moehost")
        self._tmp = tempfile.TemporaryDirectory()
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:*", "--data-dir", self._tmp.name, "--log-format", "text", *args],
            stderr=subprocess.PIPE, text=True,
        )
        self.log = []
        self.addr = None
        deadline = time.time() + 300
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r'moehost serving.* addr=(\S+)', line)
            if m:
                self.addr = m.group(1)
                break
            if time.time() > deadline:
                break
        if self.addr is None:
            self.proc.kill()
            self.proc.wait()
            self.proc.stderr.close()
            raise RuntimeError("moehost serve did not start:\n" + "".join(self.log))
        m = re.search(r'msg="dht node up" peer=(\S+)', "".join(self.log))
        self.peer_id = m.group(1) if m else ""
        # Keep draining the log so that the server never blocks on it, and
        # close the pipe once the server has exited.
        self._drain = threading.Thread(target=self._drain_log, daemon=True)
        self._drain.start()

    def _drain_log(self):
        with self.proc.stderr:
            for line in self.proc.stderr:
                self.log.append(line)

    @property
    def dht_addrs(self):
        """Its DHT multiaddrs, from the dht-addrs file of its data dir."""
        with open(os.path.join(self._tmp.name, "dht-addrs")) as f:
            return f.read().split()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(timeout=10)
        self._tmp.cleanup()
