"""The server's parameters through CheckpointService.GetParameters: the
input gradients of a RemoteExpert against hivemind's FeedforwardBlock
holding those parameters, and the parameter update one Backward makes
against the SGD step computed locally.

Run by `make test-python`; the test starts `moehost serve` itself.
"""

import os
import sys
import unittest

import torch

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "..", "scripts"))

import moehost  # noqa: E402
from hivemind_ffn import FeedforwardBlock  # noqa: E402
from serve import Server  # noqa: E402

HIDDEN = 32
LR = 0.05


def rel_err(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


class ParametersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Plain SGD (no momentum, no weight decay): p -= lr * grad.
        cls.server = Server("--experts", "ffn.0", "--hidden-dim", str(HIDDEN),
                            "--optimizer", "sgd", "--lr", str(LR), "--no-dht", "--no-checkpoints")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_backward_is_one_sgd_step_with_the_local_gradients(self):
        torch.manual_seed(3)
        expert = moehost.RemoteExpert("ffn.0", self.server.addr)
        step0, p0 = expert.fetch_parameters()
        local = FeedforwardBlock(HIDDEN)
        self.assertEqual(list(p0), list(local.state_dict()), "parameter names differ from FeedforwardBlock's")
        local.load_state_dict(p0, strict=True)

        x = torch.randn(6, HIDDEN)
        target = torch.randn(6, HIDDEN)
        xr = x.clone().requires_grad_(True)
        yr = expert(xr)
        ((yr - target) ** 2).mean().backward()  # one SGD step on the server
        xl = x.clone().requires_grad_(True)
        yl = local(xl)
        ((yl - target) ** 2).mean().backward()

        self.assertLess(rel_err(yr.detach(), yl.detach()), 1e-4, "outputs differ from FeedforwardBlock's")
        self.assertLess(rel_err(xr.grad, xl.grad), 1e-4, "input gradients differ from FeedforwardBlock's")

        step1, p1 = expert.fetch_parameters()
        self.assertEqual(step1, step0 + 1, "one backward is one optimizer step")
        for name, param in local.named_parameters():
            g = param.grad
            moved = (p0[name] - p1[name]) / LR  # what the server applied, as a gradient
            err = rel_err(moved, g)
            self.assertLess(err, 1e-3, f"{name}: update / lr is off the local gradient by {err:.3g} of its scale")
            self.assertGreater(g.abs().max().item(), 0, f"{name}: zero gradient, the check would be empty")

    def test_get_parameters_of_an_unknown_uid_is_not_found(self):
        import grpc

        with self.assertRaises(grpc.RpcError) as cm:
            moehost.RemoteExpert("nope.0", self.server.addr).fetch_parameters()
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_restore_step_keeps_proto3_optional_presence(self):
        # The stubs built from the server's descriptors keep `optional`:
        # step 0 set is not step unset.
        from moehost.v1 import checkpoint_pb2

        req = checkpoint_pb2.CheckpointServiceRestoreRequest(uid="ffn.0")
        self.assertFalse(req.HasField("step"))
        req.step = 0
        self.assertTrue(req.HasField("step"))
        self.assertNotEqual(req.SerializeToString(), checkpoint_pb2.CheckpointServiceRestoreRequest(uid="ffn.0").SerializeToString())


if __name__ == "__main__":
    unittest.main(verbosity=2)
