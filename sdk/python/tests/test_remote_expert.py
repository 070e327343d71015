"""End-to-end tests of the moehost Python client against a live server.

Run by `make test-python`, which builds the binary and the stubs first.
The test starts `moehost serve` itself (MOEHOST_BIN names the binary).
"""

import os
import sys
import unittest

import grpc
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import moehost  # noqa: E402
from serve import Server  # noqa: E402
from moehost.v1 import expert_pb2, expert_pb2_grpc  # noqa: E402

HIDDEN = 1024


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--experts", "ffn.[0:2]", "--hidden-dim", str(HIDDEN))
        cls.addr = cls.server.addr

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_train_steps_update_the_server(self):
        torch.manual_seed(0)
        expert = moehost.RemoteExpert("ffn.0", self.addr)
        before = expert.fetch_info().stats.backward_batches
        x = torch.randn(8, HIDDEN)
        target = torch.randn(8, HIDDEN)
        losses = []
        steps = 4
        for _ in range(steps):
            loss = ((expert(x) - target) ** 2).mean()
            loss.backward()  # one optimizer step on the server
            losses.append(loss.item())
        after = expert.fetch_info().stats.backward_batches
        self.assertEqual(after - before, steps, "every backward is one update on the server")
        self.assertLess(losses[-1], losses[0], f"the remote expert did not learn: losses {losses}")

    def test_input_gradients_match_finite_differences(self):
        # The input gradient against central differences of Forward along
        # random directions, which needs nothing but Forward (Forward
        # changes nothing; the Backward that trains comes last).
        # test_parameters.py checks it against FeedforwardBlock too.
        torch.manual_seed(1)
        expert = moehost.RemoteExpert("ffn.1", self.addr)
        x = torch.randn(4, HIDDEN)
        w = torch.randn(4, HIDDEN)

        def loss_of(v):
            with torch.no_grad():
                return (expert(v).double() * w.double()).sum().item()

        eps = 1e-2
        dirs = [torch.randn(4, HIDDEN) for _ in range(3)]
        numeric = [(loss_of(x + eps * d) - loss_of(x - eps * d)) / (2 * eps) for d in dirs]
        xg = x.clone().requires_grad_(True)
        (expert(xg) * w).sum().backward()
        for d, num in zip(dirs, numeric):
            ana = (xg.grad.double() * d.double()).sum().item()
            self.assertLess(abs(ana - num), 1e-2 * max(1.0, abs(num)),
                            f"directional derivative: backward {ana}, finite differences {num}")

    def test_big_batch_past_grpcio_default_limit(self):
        expert = moehost.RemoteExpert("ffn.0", self.addr)
        x = torch.randn(1024, HIDDEN)  # 4 MiB of float32, over grpcio's default
        with torch.no_grad():
            y = expert(x)
        self.assertEqual(tuple(y.shape), (1024, HIDDEN))
        # The same call with grpcio's default limits fails, so the raised
        # limit is what made it work.
        stub = expert_pb2_grpc.ExpertServiceStub(grpc.insecure_channel(self.addr))
        req = expert_pb2.ForwardRequest(uid="ffn.0", inputs=[moehost.expert._to_wire(x, moehost.wire_dtypes[torch.float32])])
        with self.assertRaises(grpc.RpcError) as cm:
            stub.Forward(req)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)

    def test_half_wire_dtypes(self):
        torch.manual_seed(2)
        x = torch.randn(16, HIDDEN)
        with torch.no_grad():
            ref = moehost.RemoteExpert("ffn.1", self.addr)(x)
            scale = ref.abs().max().item()
            for dt, unit in [(torch.float16, 2 ** -11), (torch.bfloat16, 2 ** -8)]:
                y = moehost.RemoteExpert("ffn.1", self.addr, wire_dtype=dt)(x)
                self.assertEqual(y.dtype, torch.float32)
                err = (y - ref).abs().max().item()
                self.assertLess(err, 4 * unit * scale, f"{dt}: max error {err} of scale {scale}")
        with self.assertRaises(ValueError):
            moehost.RemoteExpert("ffn.1", self.addr, wire_dtype=torch.int8)

    def test_unknown_uid_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as cm:
            moehost.RemoteExpert("nope.0", self.addr).fetch_info()
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("ListExperts", cm.exception.details())

    def test_urls_and_typed_errors(self):
        # The "http://host:port" the CLI and discover print is an endpoint.
        url = "http://" + self.addr
        expert = moehost.RemoteExpert("ffn.0", url)
        self.assertEqual(tuple(expert(torch.zeros(1, HIDDEN)).shape), (1, HIDDEN))
        with self.assertRaises(moehost.NotFoundError) as cm:
            moehost.RemoteExpert("nope.0", url).fetch_info()
        self.assertIn("nope.0", str(cm.exception))
        self.assertNotIn("_InactiveRpcError", str(cm.exception))
        with self.assertRaises(moehost.InvalidArgumentError) as cm:
            expert(torch.zeros(1, 3))
        self.assertIn("shape", cm.exception.message)
        with self.assertRaises(moehost.UnavailableError):
            moehost.RemoteExpert("ffn.0", "http://127.0.0.1:1", timeout=10).fetch_info()


if __name__ == "__main__":
    unittest.main(verbosity=2)
