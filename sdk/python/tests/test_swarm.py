"""RemoteMixtureOfExperts and the swarm, against live `moehost serve`
processes: a tenant grid (me.linear.[0:2]) is found by its grid prefix;
a server killed with SIGKILL (its records still live in the DHT) is
banned after its first failure, so that the next calls go to the live
experts; trusted_peers keeps only the servers it names.
Run by `make test-python`.
"""

import os
import signal
import sys
import time
import unittest

import torch

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, here)

import moehost  # noqa: E402
from serve import Server  # noqa: E402

HIDDEN = 4
# A valid peer ID whose key no server in these tests holds.
NOBODY = "12D3KooWPMSVuobA4jb3cr1XeWZZK1qHYTAZ5e9KTSFMJEbsBafm"


def gate(moe, scores):
    """Makes the mixture's gate score coordinate i as scores[i] whatever the input."""
    with torch.no_grad():
        moe.proj.weight.zero_()
        moe.proj.bias.copy_(torch.tensor(scores, dtype=torch.float32))


class SwarmTest(unittest.TestCase):
    def test_tenant_grid_is_found_by_its_prefix(self):
        s = Server("--experts", "me.linear.[0:2]", "--hidden-dim", str(HIDDEN), "--no-checkpoints", "--update-period", "1s")
        try:
            moe = moehost.RemoteMixtureOfExperts(in_features=HIDDEN, grid_size=(2,), uid_prefix="me.linear.",
                                                 discovery=s.addr, k_best=2, k_min=2)
            out = moe(torch.randn(3, HIDDEN))
            self.assertEqual(tuple(out.shape), (3, HIDDEN))
        finally:
            s.stop()

    def test_a_killed_server_is_banned_and_replaced(self):
        # Records live 20 s: the killed server stays in the DHT meanwhile.
        a = Server("--experts", "ffn.[0:2]", "--hidden-dim", str(HIDDEN), "--no-checkpoints", "--update-period", "10s")
        b = Server("--experts", "ffn.[2:4]", "--hidden-dim", str(HIDDEN), "--no-checkpoints", "--update-period", "10s",
                   "--initial-peers", a.dht_addrs[0])
        try:
            moe = moehost.RemoteMixtureOfExperts(in_features=HIDDEN, grid_size=(4,), uid_prefix="ffn.",
                                                 discovery=a.addr, k_best=2, k_min=2, ban_base=30.0)
            gate(moe, [0.0, 0.0, 5.0, 5.0])  # b's experts first
            deadline = 30
            while True:
                try:
                    moe(torch.randn(1, HIDDEN))
                    break
                except moehost.KMinNotMetError:
                    deadline -= 1
                    self.assertGreater(deadline, 0, "b's experts never became discoverable")
                    time.sleep(1)
            b.proc.send_signal(signal.SIGKILL)
            b.proc.wait()
            failed = 0
            for _ in range(5):
                try:
                    moe(torch.randn(2, HIDDEN)).sum().backward()
                except moehost.KMinNotMetError:
                    failed += 1
            self.assertLessEqual(failed, 1, "the dead server was called again after it failed")
            self.assertTrue(moe.banned(b.addr))
        finally:
            a.stop()
            b.stop()

    def test_trusted_peers(self):
        s = Server("--experts", "ffn.[0:2]", "--hidden-dim", str(HIDDEN), "--no-checkpoints", "--update-period", "1s")
        try:
            trusting = moehost.RemoteMixtureOfExperts(in_features=HIDDEN, grid_size=(2,), uid_prefix="ffn.",
                                                      discovery=s.addr, k_best=2, trusted_peers=[s.peer_id])
            self.assertEqual(tuple(trusting(torch.randn(1, HIDDEN)).shape), (1, HIDDEN))
            stranger = moehost.RemoteMixtureOfExperts(in_features=HIDDEN, grid_size=(2,), uid_prefix="ffn.",
                                                      discovery=s.addr, k_best=2, trusted_peers=[NOBODY])
            with self.assertRaisesRegex(moehost.KMinNotMetError, "trusted"):
                stranger(torch.randn(1, HIDDEN))
        finally:
            s.stop()


if __name__ == "__main__":
    unittest.main()
