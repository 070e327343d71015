"""sdk/python installed as its README says, into a fresh virtual
environment over Debian's packages (python3 -m venv --system-site-packages,
then pip install --no-build-isolation --no-index ./sdk/python), and used
from that environment's python outside the source tree, so that it
imports the installed package and its shipped stubs: server info, an
upload of the Go ffn example, a deployment, and Forward on it against a
local FeedforwardBlock holding the expert's parameters, on a live
`moehost serve --tenants` with a fresh data dir. An editable install
(pip install -e) imports the checkout's files.

Run by `make test-python`; the test starts `moehost serve` itself.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import re
import tempfile
import unittest

here = os.path.dirname(__file__)
sys.path.insert(0, here)

from serve import Server, add_tenant  # noqa: E402

ROOT = os.path.abspath(os.path.join(here, "..", "..", ".."))
PACKAGE = os.path.join(ROOT, "sdk", "python")
FFN = os.path.join(ROOT, "examples", "wasm-experts", "ffn", "ffn.wasm")
HIDDEN = 8

# What the user runs, from the installed package: argv is the server's
# address, a tenant's token and the module's path; it prints one JSON
# object.
SCRIPT = r'''
import importlib.metadata, json, sys
import torch
import moehost, moehost.v1.module_pb2
from moehost.layers import FeedforwardBlock

addr, token, path = sys.argv[1:4]
out = {"file": moehost.__file__, "stubs": moehost.v1.module_pb2.__file__,
       "version": importlib.metadata.version("moehost")}
with moehost.Client(addr, token=token) as c:
    info = c.server_info()
    out["listen"], out["experts_before"] = info.listen_address, info.expert_count
    mod = c.upload_module(path)
    out["digest"], out["size"] = mod.digest, mod.size_bytes
    out["uids"] = c.deploy("alice.ffn.0", mod, config={"hidden_dim": 8}, optimizer={"name": "sgd", "lr": 0.1})
    out["experts_after"] = c.server_info().expert_count
expert = moehost.RemoteExpert("alice.ffn.0", "http://" + addr, token=token)
torch.manual_seed(0)
x = torch.randn(5, 8)
y = expert(x)
step, params = expert.fetch_parameters()
block = FeedforwardBlock(8)
block.load_state_dict(params, strict=True)
out["shape"], out["step"] = list(y.shape), step
out["max_diff"] = (y - block(x)).abs().max().item()
print(json.dumps(out))
'''


def clean_env():
    """The environment without what would let the source tree or a token in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MOEHOST_TOKEN") and not k.startswith("PIP_")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


class InstallTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name

    def install(self, *args: str) -> str:
        """Makes a venv over the system's packages, pip installs args into
        it from the repository's root, and returns the venv's python."""
        venv = os.path.join(self.tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True, env=clean_env())
        python = os.path.join(venv, "bin", "python")
        # setuptools builds in sdk/python/build and moehost.egg-info and
        # keeps what an earlier build put there (files since removed, the
        # list of sources it ships as package data): start from a clone's.
        for d in ("build", "moehost.egg-info"):
            shutil.rmtree(os.path.join(PACKAGE, d), ignore_errors=True)
        res = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir",
                              "--disable-pip-version-check", *args], cwd=ROOT, env=clean_env(), capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, f"pip install {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
        return python

    def run_outside(self, python: str, *args: str) -> subprocess.CompletedProcess:
        """Runs python with args in a directory outside the source tree."""
        away = os.path.join(self.tmp, "elsewhere")
        os.makedirs(away, exist_ok=True)
        return subprocess.run([python, *args], cwd=away, env=clean_env(), capture_output=True, text=True, timeout=300)

    def test_installed_package_uploads_deploys_and_forwards(self):
        python = self.install("./sdk/python")
        tenants = os.path.join(self.tmp, "tenants.json")
        token = add_tenant(tenants, "alice", "alice")
        server = Server("--tenants", tenants, "--experts", "ffn.0", "--module", "ffn-c", "--hidden-dim", str(HIDDEN),
                        "--no-checkpoints", "--no-dht")
        self.addCleanup(server.stop)
        res = self.run_outside(python, "-c", SCRIPT, server.addr, token, FFN)
        self.assertEqual(res.returncode, 0, f"the installed client failed:\n{res.stderr}")
        out = json.loads(res.stdout.strip().splitlines()[-1])

        site = os.path.join(self.tmp, "venv", "lib")
        for key in ("file", "stubs"):
            self.assertTrue(out[key].startswith(site), f"moehost imported from {out[key]}, not the venv")
        with open(os.path.join(PACKAGE, "pyproject.toml")) as f:
            self.assertEqual(out["version"], re.search(r'(?m)^version = "(.*)"$', f.read()).group(1))
        self.assertEqual(out["listen"], server.addr)
        self.assertEqual((out["experts_before"], out["experts_after"]), (1, 2))
        with open(FFN, "rb") as f:
            data = f.read()
        self.assertGreater(len(data), 1 << 20, "the module should take more than one chunk")
        self.assertEqual((out["digest"], out["size"]), ("sha256:" + hashlib.sha256(data).hexdigest(), len(data)))
        self.assertEqual(out["uids"], ["alice.ffn.0"])
        self.assertEqual((out["shape"], out["step"]), ([5, HIDDEN], 0))
        self.assertLess(out["max_diff"], 1e-4, "Forward differs from FeedforwardBlock with the expert's parameters")

    def test_editable_install_imports_the_checkout(self):
        python = self.install("-e", "./sdk/python")
        res = self.run_outside(python, "-c", "import moehost, moehost.v1.server_pb2_grpc as s; "
                                             "print(moehost.__file__); print(s.__file__); print(moehost.Client.__name__)")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(res.stdout.split(), [os.path.join(PACKAGE, "moehost", "__init__.py"),
                                              os.path.join(PACKAGE, "moehost", "v1", "server_pb2_grpc.py"), "Client"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
