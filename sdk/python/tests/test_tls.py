"""The Python client against `moehost serve --tls-cert`, with a CA made
for the test (internal/cmd/testca): https:// endpoints get a channel over
TLS that trusts ca_file or $MOEHOST_CA_FILE; without the CA the call is
refused; RemoteMixtureOfExperts finds the https:// records the server
announces and calls them over TLS; "host:port" stays cleartext.

Run by `make test-python`, which builds testca (MOEHOST_TESTCA); without
it the test runs `go run ./internal/cmd/testca` from the checkout.
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import torch

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, here)

import moehost  # noqa: E402
from moehost.expert import CA_FILE_ENV  # noqa: E402
from serve import Server  # noqa: E402

HIDDEN = 4
ROOT = os.path.join(here, "..", "..", "..")


def make_ca(directory: str):
    """Writes a CA, a server pair for 127.0.0.1 and a client pair to
    directory."""
    testca = os.environ.get("MOEHOST_TESTCA")
    cmd = [testca, directory] if testca else ["go", "run", "./internal/cmd/testca", directory]
    subprocess.run(cmd, check=True, cwd=ROOT)


def no_ca_env():
    """Patches $MOEHOST_CA_FILE away."""
    patch = mock.patch.dict(os.environ)
    patch.start()
    os.environ.pop(CA_FILE_ENV, None)
    return patch


class TLSTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        make_ca(cls.tmp.name)
        cls.ca = os.path.join(cls.tmp.name, "ca.pem")
        cls.server = Server("--tls-cert", os.path.join(cls.tmp.name, "server.pem"),
                            "--tls-key", os.path.join(cls.tmp.name, "server-key.pem"),
                            "--module", "nop", "--experts", "nop.[0:2]", "--hidden-dim", str(HIDDEN),
                            "--no-checkpoints", "--update-period", "1s")
        cls.url = "https://" + cls.server.addr

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def setUp(self):
        self.addCleanup(no_ca_env().stop)

    def test_client_and_expert_with_ca_file(self):
        with moehost.Client(self.url, ca_file=self.ca) as c:
            self.assertEqual(sorted(e.uid for e in c.experts()), ["nop.0", "nop.1"])
        x = torch.tensor([[1.0, -2.0, 3.5, 4.0], [0.25, 7.0, -3e5, 1e-7]], requires_grad=True)
        expert = moehost.RemoteExpert("nop.1", self.url, ca_file=self.ca, timeout=30)
        y = expert(x)
        self.assertTrue(torch.equal(y, x.detach()), y)  # nop is the identity
        y.sum().backward()
        self.assertTrue(torch.equal(x.grad, torch.ones_like(x)), x.grad)

    def test_ca_file_from_the_environment(self):
        os.environ[CA_FILE_ENV] = self.ca
        info = moehost.RemoteExpert("nop.0", self.url, timeout=30).fetch_info()
        self.assertEqual(info.uid, "nop.0")

    def test_unknown_ca_is_refused(self):
        with self.assertRaises(moehost.UnavailableError) as cm:
            moehost.RemoteExpert("nop.0", self.url, timeout=30).fetch_info()
        self.assertIn("certificate verify failed", str(cm.exception))
        self.assertIn("ca_file= or $MOEHOST_CA_FILE", str(cm.exception))

    def test_a_ca_file_without_a_certificate(self):
        with self.assertRaises(ValueError) as cm:
            moehost.Client(self.url, ca_file=os.path.join(self.tmp.name, "server-key.pem"))
        self.assertIn("no PEM certificate", str(cm.exception))

    def test_cleartext_endpoint_to_a_tls_port_fails(self):
        with self.assertRaises(moehost.MoehostError):
            moehost.RemoteExpert("nop.0", self.server.addr, timeout=30).fetch_info()

    def test_mixture_calls_https_records(self):
        moe = moehost.RemoteMixtureOfExperts(in_features=HIDDEN, grid_size=(2,), uid_prefix="nop.",
                                             discovery=self.url, k_best=2, k_min=2, ca_file=self.ca)
        x = torch.randn(3, HIDDEN)
        # The server announces its experts in the background once it
        # serves: the first lookups may find one of them, or none.
        for attempt in range(100):
            try:
                chosen = moe.beam_search(moe.proj(x).split(moe.grid_size, dim=-1))
                break
            except moehost.KMinNotMetError:
                self.assertLess(attempt, 99, "the grid was never found whole")
                time.sleep(0.1)
        self.assertEqual({c.addr for row in chosen for c in row}, {self.url})
        out = moe(x)
        self.assertEqual(tuple(out.shape), (3, HIDDEN))
        # Both experts are nop, the identity: any mix of them is x.
        self.assertTrue(torch.allclose(out, x, atol=1e-6), (out, x))


if __name__ == "__main__":
    unittest.main()
