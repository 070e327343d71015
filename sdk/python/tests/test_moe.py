"""RemoteMixtureOfExperts against a live `moehost serve` with its DHT on:
outputs and gradients against the same mixture computed locally with
FeedforwardBlocks holding the experts' parameters (GetParameters), and
k_min and timeouts.

The server's optimizer is off, so that the many Backward calls of one
mixture backward leave the experts as the local copies have them.
Run by `make test-python`; the test starts `moehost serve` itself.
"""

import os
import socket
import sys
import time
import unittest

import torch

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "..", "scripts"))

import moehost  # noqa: E402
from hivemind_ffn import FeedforwardBlock  # noqa: E402
from serve import Server  # noqa: E402

HIDDEN = 16
GRID = (2, 3)


def rel_err(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


class MixtureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--experts", "ffn.[0:2].[0:3]", "--hidden-dim", str(HIDDEN),
                            "--optimizer", "none", "--no-checkpoints")
        assert cls.server.peer_id, "the server runs no DHT node"
        cls.uids = [f"ffn.{i}.{j}" for i in range(GRID[0]) for j in range(GRID[1])]
        cls.local = {}
        for uid in cls.uids:
            _, params = moehost.RemoteExpert(uid, cls.server.addr).fetch_parameters()
            block = FeedforwardBlock(HIDDEN)
            block.load_state_dict(params, strict=True)
            cls.local[uid] = block

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def moe(self, **kw):
        args = dict(in_features=HIDDEN, grid_size=GRID, uid_prefix="ffn.", discovery=self.server.addr, k_best=3)
        args.update(kw)
        return moehost.RemoteMixtureOfExperts(**args)

    def local_mixture(self, proj, x, k):
        """The mixture by hand: every expert's score, the top k, softmax."""
        scores = proj(x).split(GRID, dim=-1)
        out = []
        for b in range(x.shape[0]):
            logits = {uid: scores[0][b, int(uid.split(".")[1])] + scores[1][b, int(uid.split(".")[2])] for uid in self.uids}
            top = sorted(self.uids, key=lambda u: -logits[u].item())[:k]
            w = torch.softmax(torch.stack([logits[u] for u in top]), dim=0)
            out.append(sum(w[i] * self.local[u](x[b:b + 1])[0] for i, u in enumerate(top)))
        return torch.stack(out)

    def test_outputs_and_gradients_match_a_local_mixture(self):
        torch.manual_seed(4)
        for k in (1, 3):
            with self.subTest(k_best=k):
                moe = self.moe(k_best=k)
                local_proj = torch.nn.Linear(HIDDEN, sum(GRID))
                local_proj.load_state_dict(moe.proj.state_dict())
                x = torch.randn(5, HIDDEN)
                w = torch.randn(5, HIDDEN)

                xr = x.clone().requires_grad_(True)
                yr = moe(xr)
                (yr * w).sum().backward()
                xl = x.clone().requires_grad_(True)
                yl = self.local_mixture(local_proj, xl, k)
                (yl * w).sum().backward()

                self.assertEqual(tuple(yr.shape), (5, HIDDEN))
                self.assertLess(rel_err(yr.detach(), yl.detach()), 1e-4, "outputs")
                self.assertLess(rel_err(xr.grad, xl.grad), 1e-4, "input gradients")
                if k > 1:  # with one expert the gate's softmax is constant
                    self.assertLess(rel_err(moe.proj.weight.grad, local_proj.weight.grad), 1e-4, "gate weight gradients")
                    self.assertLess(rel_err(moe.proj.bias.grad, local_proj.bias.grad), 1e-4, "gate bias gradients")

    def test_every_chosen_expert_is_called_forward_and_backward(self):
        # Beam search over the whole grid: all 6 experts, each once per
        # sample, forward and then backward.
        moe = self.moe(k_best=len(self.uids))

        def counts():
            stats = {u: moehost.RemoteExpert(u, self.server.addr).fetch_info().stats for u in self.uids}
            return {u: (s.forward_examples, s.backward_examples) for u, s in stats.items()}

        before = counts()
        moe(torch.randn(2, HIDDEN)).sum().backward()
        after = counts()
        self.assertEqual({u: (after[u][0] - before[u][0], after[u][1] - before[u][1]) for u in self.uids},
                         {u: (2, 2) for u in self.uids})

    def test_k_min_not_met_raises(self):
        # Every chosen expert's address is a socket that takes the
        # connection and never speaks: no call can answer within the
        # forward timeout. (A deadline shorter than a loopback call was
        # met now and then: gRPC checks deadlines on a timer.)
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        self.addCleanup(silent.close)
        moe = self.moe(forward_timeout=0.2)
        scores = moe.proj(torch.randn(2, HIDDEN)).split(GRID, dim=-1)
        chosen = moe.beam_search(scores)
        for row in chosen:
            for c in row:
                c.addr = "127.0.0.1:%d" % silent.getsockname()[1]
        with self.assertRaises(moehost.KMinNotMetError) as cm:
            moe._forward_all(chosen, torch.randn(2, HIDDEN))
        self.assertIn("k_min is 1", str(cm.exception))
        self.assertIn("DEADLINE_EXCEEDED", str(cm.exception))

    def test_a_grid_the_dht_does_not_know_raises(self):
        with self.assertRaises(moehost.KMinNotMetError) as cm:
            self.moe(uid_prefix="nope.")(torch.randn(1, HIDDEN))
        self.assertIn("'nope'", str(cm.exception))

    def test_bad_arguments(self):
        for kw in [dict(k_min=4), dict(k_min=0), dict(backward_k_min=4), dict(grid_size=(2, 0)), dict(wire_dtype=torch.int8)]:
            with self.subTest(**{k: str(v) for k, v in kw.items()}):
                with self.assertRaises(ValueError):
                    self.moe(**kw)


if __name__ == "__main__":
    unittest.main(verbosity=2)
