"""`moehost serve --hivemind` in a child process, for what drives it with hivemind's own clients
(tests/hivemind_e2e.py, scripts/bench_hivemind.py).

The server listens on 127.0.0.1 with a fresh data dir, and is ready once it logs that it serves and has written
the libp2p addresses hivemind's clients dial (`hivemind-addrs` in its data dir).
"""
import os
import re
import shutil
import subprocess
import tempfile
import time


class MoehostServe:
    """`moehost serve --hivemind --listen 127.0.0.1:0 --data-dir TMP ARGS...` with its log in the data dir."""

    def __init__(self, binary, args, prefix="moehost-hivemind-", timeout=180):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.log = open(os.path.join(self.dir, "serve.log"), "w+")
        self.proc = subprocess.Popen(
            [binary, "serve", "--hivemind", "--listen", "127.0.0.1:0", "--data-dir", self.dir, *args],
            stdout=self.log, stderr=subprocess.STDOUT)
        addrs = os.path.join(self.dir, "hivemind-addrs")
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.log.seek(0)
            m = re.search(r'msg="moehost serving" addr=(\S+)', self.log.read())
            if m and os.path.exists(addrs):
                self.addr = m.group(1)
                break
            if self.proc.poll() is not None:
                self.stop(keep=True)
                raise RuntimeError("moehost exited:\n" + self.logs())
            time.sleep(0.2)
        else:
            self.stop(keep=True)
            raise RuntimeError("moehost did not start:\n" + self.logs())
        with open(addrs) as f:
            self.maddrs = f.read().split()
        self.peer_id = self.maddrs[0].rsplit("/p2p/", 1)[1]

    def logs(self):
        """The last 4,000 characters of the server's log."""
        self.log.seek(0)
        return self.log.read()[-4000:]

    def alive(self):
        return self.proc.poll() is None

    def stop(self, keep=False):
        """Stops the server (SIGTERM, then SIGKILL after 30 s) and, unless keep, removes its data dir."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not keep:
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)
