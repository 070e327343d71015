"""A tenant trains its own expert from Python against a live `moehost
serve --tenants`: with its token (token=, or $MOEHOST_TOKEN) a backward
through RemoteExpert or RemoteMixtureOfExperts is one optimizer step of
the expert; without one the server refuses it as Unauthenticated, names
the way in, and the expert is unchanged.

Run by `make test-python`; the test starts `moehost serve` itself.
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import grpc
import torch

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, here)

import moehost  # noqa: E402
from serve import Server  # noqa: E402

HIDDEN = 8
UID = "alice.ffn.0"
FFN_C = os.path.join(here, "..", "..", "..", "examples", "wasm-experts", "ffn-c", "ffn-c.wasm")


def cli(*args: str) -> str:
    """Runs the moehost CLI (with no $MOEHOST_TOKEN) and returns the last
    line of its stdout."""
    env = {k: v for k, v in os.environ.items() if k != moehost.expert.TOKEN_ENV}
    out = subprocess.run([os.environ.get("MOEHOST_BIN", "moehost"), *args], env=env,
                         check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def env_token(value):
    """Patches $MOEHOST_TOKEN to value (None: unset)."""
    patch = mock.patch.dict(os.environ)
    patch.start()
    os.environ.pop(moehost.expert.TOKEN_ENV, None)
    if value is not None:
        os.environ[moehost.expert.TOKEN_ENV] = value
    return patch


class TenantTokenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        tenants = os.path.join(cls.tmp.name, "tenants.json")
        cls.alice = cli("tenant", "add", "alice", "--prefix", "alice", "--tenants", tenants)
        cls.server = Server("--tenants", tenants, "--experts", "ffn.0", "--module", "ffn-c",
                            "--hidden-dim", str(HIDDEN), "--no-checkpoints")
        url = "http://" + cls.server.addr
        digest = cli("upload", "--server", url, "--token", cls.alice, FFN_C)
        cli("deploy", "--server", url, "--token", cls.alice, "--module", digest, "--experts", UID,
            "--config", f"hidden_dim={HIDDEN}")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def parameters(self):
        return moehost.RemoteExpert(UID, self.server.addr, token=self.alice).fetch_parameters()

    def check(self, train, trained: bool):
        """Runs train(), which does one backward, and checks that it made
        one step that moved every parameter, or was refused as
        Unauthenticated with the way in named and moved nothing."""
        step0, p0 = self.parameters()
        err = None
        try:
            train()
        except (grpc.RpcError, moehost.KMinNotMetError) as e:
            err = e
        step1, p1 = self.parameters()
        self.assertEqual(list(p0), list(p1))
        if trained:
            self.assertIsNone(err)
            self.assertEqual(step1, step0 + 1, "one backward is one optimizer step")
            for name in p0:
                self.assertFalse(torch.equal(p0[name], p1[name]), f"{name} did not change")
            return
        self.assertIsNotNone(err, "backward without a token was served")
        if isinstance(err, grpc.RpcError):
            self.assertEqual(err.code(), grpc.StatusCode.UNAUTHENTICATED)
        else:
            self.assertIn("UNAUTHENTICATED", str(err))
        self.assertRegex(str(err), r"needs a token .*: its owner's")
        self.assertEqual(step1, step0, "a refused backward made a step")
        for name in p0:
            self.assertTrue(torch.equal(p0[name], p1[name]), f"a refused backward changed {name}")

    def test_remote_expert(self):
        cases = [
            ("token=", None, {"token": self.alice}, True),
            ("$MOEHOST_TOKEN", self.alice, {}, True),
            ("no token", None, {}, False),
            ('token="" over $MOEHOST_TOKEN', self.alice, {"token": ""}, False),
        ]
        for name, env, kwargs, trained in cases:
            with self.subTest(name):
                patch = env_token(env)
                try:
                    expert = moehost.RemoteExpert(UID, self.server.addr, **kwargs)
                    x = torch.randn(3, HIDDEN, requires_grad=True)
                    self.check(lambda: expert(x).sum().backward(), trained)
                finally:
                    patch.stop()

    def test_remote_mixture_of_experts(self):
        # The deployed expert reaches the DHT at its first announcement.
        probe = self.mixture(token=self.alice)
        deadline = time.monotonic() + 60
        while True:
            try:
                probe.beam_search([torch.zeros(1, 1)])
                break
            except moehost.KMinNotMetError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for name, kwargs, trained in [("token=", {"token": self.alice}, True), ('token=""', {"token": ""}, False)]:
            with self.subTest(name):
                moe = self.mixture(**kwargs)
                x = torch.randn(1, HIDDEN)  # one sample: one Backward, one step
                self.check(lambda: moe(x).sum().backward(), trained)

    def mixture(self, **kwargs):
        return moehost.RemoteMixtureOfExperts(in_features=HIDDEN, grid_size=(1,), uid_prefix="alice.ffn",
                                              discovery=self.server.addr, k_best=1, **kwargs)


if __name__ == "__main__":
    unittest.main(verbosity=2)
