"""The unmodified hivemind 1.1.11 client against `moehost serve --hivemind`: ffn, and hivemind's other experts
(det_dropout with its int64 mask, transformer with its bool padding mask, nop_delay) as hivemind declares them.

Run by `make test-hivemind` with the python of the hivemind build
(scripts/build-hivemind.sh); MOEHOST_BIN names the moehost binary. Every
hivemind process runs with nat_port_map=False on 127.0.0.1 only.
"""

import base64
import json
import os
import sys
import time
import unittest
import urllib.request

import numpy as np
import torch

import hivemind
from hivemind.compression import serialize_torch_tensor
from hivemind.moe.client.expert import RemoteExpert, expert_backward, expert_forward
from hivemind.moe.client.moe import RemoteMixtureOfExperts
from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker
from hivemind.moe.client.switch_moe import RemoteSwitchMixtureOfExperts
from hivemind.moe.expert_uid import ExpertInfo
from hivemind.moe.server import background_server
from hivemind.moe.server.dht_handler import get_experts
from hivemind.moe.server.layers import name_to_input
from hivemind.moe.server.layers.common import FeedforwardBlock
from hivemind.moe.server.layers.dropout import DeterministicDropoutNetwork
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PHandlerError
from hivemind.proto import runtime_pb2
from hivemind.utils.tensor_descr import DUMMY_BATCH_SIZE, BatchTensorDescriptor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from moehost_hivemind import MoehostServe  # noqa: E402

HID = 16
GRID = ["ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1"]
P2P = dict(host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False)
BIN = os.environ.get("MOEHOST_BIN", "moehost")


class Moehost(MoehostServe):
    """`moehost serve --hivemind` in a child process, serving experts of width HID."""

    def __init__(self, experts, *extra):
        super().__init__(BIN, ["--experts", experts, "--hidden-dim", str(HID), "--no-dht", "--update-period", "2s",
                               "--log-level", "debug", *extra])

    def parameters(self, uid):
        """The expert's parameters now, through CheckpointService.GetParameters (Connect JSON)."""
        req = urllib.request.Request(f"http://{self.addr}/moehost.v1.CheckpointService/GetParameters",
                                     data=json.dumps({"uid": uid}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as res:
            body = json.load(res)
        out = {}
        for p in body["parameters"]:
            t = p["tensor"]
            shape = [int(d) for d in t.get("shape", [])]
            out[p["name"]] = torch.from_numpy(np.frombuffer(base64.b64decode(t["data"]), dtype="<f4").copy()).reshape(shape)
        return out

    def local_block(self, uid):
        block = FeedforwardBlock(HID)
        block.load_state_dict(self.parameters(uid), strict=True)
        return block


def find(dht, uids, tries=40):
    experts = get_experts(dht, uids)
    for _ in range(tries):
        if all(e is not None for e in experts):
            return experts
        time.sleep(0.5)
        experts = get_experts(dht, uids)
    raise AssertionError(f"experts not found in the DHT: {experts}")


class HivemindClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Moehost("ffn.[0:2].[0:2]")
        cls.dht = hivemind.DHT(initial_peers=cls.server.maddrs, start=True, **P2P)

    @classmethod
    def tearDownClass(cls):
        cls.dht.shutdown()
        cls.server.stop()

    def test_forward_backward_match_pytorch(self):
        experts = find(self.dht, GRID)
        self.assertEqual({str(e.peer_id) for e in experts}, {self.server.maddrs[0].rsplit("/", 1)[-1]})
        torch.manual_seed(1)
        for expert in experts:
            local = self.server.local_block(expert.uid)
            x = torch.randn(5, HID, requires_grad=True)
            out = expert(x)
            x_local = x.detach().clone().requires_grad_(True)
            want = local(x_local)
            self.assertLessEqual((out - want).abs().max().item(), 1e-5, expert.uid)
            w = torch.randn(5, HID)
            (out * w).sum().backward()
            (want * w).sum().backward()
            self.assertLessEqual((x.grad - x_local.grad).abs().max().item(), 1e-4, expert.uid)
            # The backward took one optimizer step, as hivemind's server does.
            after = self.server.parameters(expert.uid)
            self.assertFalse(torch.equal(after["ffn.weight"], local.ffn.weight.detach()), expert.uid)

    def test_over_unary_limit_streams(self):
        (expert,) = find(self.dht, ["ffn.1.0"])
        local = self.server.local_block(expert.uid)
        rows = 3 * 2**20 // (4 * HID)  # 3 MiB of input: over the 2 MiB unary limit
        x = torch.randn(rows, HID)
        out = expert(x)
        self.assertEqual(out.shape, (rows, HID))
        self.assertLessEqual((out - local(x)).abs().max().item(), 1e-5)
        self.assertIn("rpc_forward_stream", self.server.logs())

    def test_bad_input(self):
        (expert,) = find(self.dht, ["ffn.0.1"])
        with self.assertRaises(P2PHandlerError) as e:
            expert(torch.randn(3, HID + 1))
        self.assertIn("ValueError", str(e.exception))
        p2p = expert.p2p
        ghost = RemoteExpert(ExpertInfo("ffn.7.7", expert.peer_id), p2p)
        with self.assertRaises(P2PHandlerError) as e:
            ghost.info
        self.assertIn("KeyError", str(e.exception))

        # Garbage frames on the stream handler, through the client's own daemon.
        async def garbage():
            _, reader, writer = await p2p._client.stream_open(expert.peer_id, ("ConnectionHandler.rpc_forward_stream",))
            writer.write(b"\x07" + b"\xff" * 64)
            await writer.drain()
            data = await reader.read(1 << 16)
            writer.close()
            return data
        from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker
        try:
            RemoteExpertWorker.run_coroutine(garbage())
        except Exception:
            pass
        self.assertTrue(self.server.alive())
        out = expert(torch.randn(2, HID))
        self.assertEqual(out.shape, (2, HID))


class HivemindExpertsTest(unittest.TestCase):
    """hivemind's other experts on moehost (--module det_dropout, transformer, nop_delay), called by the unmodified
    client with the inputs hivemind's own server declares for them."""

    def serve(self, module, experts):
        server = Moehost(experts, "--module", module)
        self.addCleanup(server.stop)
        dht = hivemind.DHT(initial_peers=server.maddrs, start=True, **P2P)
        self.addCleanup(dht.shutdown)
        return server, dht

    def assert_schema_is_hiveminds(self, expert, expert_cls):
        """The forward schema is what hivemind's Server.create derives from name_to_input[expert_cls]."""
        sample = name_to_input[expert_cls](DUMMY_BATCH_SIZE, HID)
        sample = sample if isinstance(sample, tuple) else (sample,)
        want = [BatchTensorDescriptor.from_tensor(t) for t in sample]
        args, kwargs = expert.info["forward_schema"]
        self.assertEqual(kwargs, {})
        self.assertEqual([(tuple(d.shape), d.dtype) for d in args], [(tuple(d.shape), d.dtype) for d in want])

    def test_det_dropout_int64_mask(self):
        server, dht = self.serve("det_dropout", "det_dropout.[0:2]")
        (expert,) = find(dht, ["det_dropout.1"])
        self.assert_schema_is_hiveminds(expert, "det_dropout")
        self.assertEqual(expert.info["forward_schema"][0][1].dtype, torch.int64)
        # hivemind's own module, in training mode as its server runs it (the mask then applies).
        local = DeterministicDropoutNetwork(HID)
        local.load_state_dict(server.parameters(expert.uid), strict=True)
        torch.manual_seed(3)
        x = torch.randn(6, HID, requires_grad=True)
        mask = torch.randint(0, 2, (6, HID))  # int64, as name_to_input["det_dropout"] makes it
        self.assertEqual(mask.dtype, torch.int64)
        out = expert(x, mask)
        x_local = x.detach().clone().requires_grad_(True)
        want = local(x_local, mask)
        self.assertLessEqual((out - want).abs().max().item(), 1e-5)
        # The mask matters.
        self.assertGreater((out - local(x.detach(), torch.ones_like(mask))).abs().max().item(), 1e-3)
        w = torch.randn(6, HID)
        (out * w).sum().backward()
        (want * w).sum().backward()
        self.assertLessEqual((x.grad - x_local.grad).abs().max().item(), 1e-4)

        # On the wire, the mask's gradient is int64 zeros, as hivemind's ModuleBackend.backward returns
        # torch.zeros_like for inputs that are not floating point.
        inputs = (x.detach(), mask, w)
        schema = tuple(hivemind.utils.nested.nested_flatten((expert.info["forward_schema"], expert.info["outputs_schema"])))
        grads = RemoteExpertWorker.run_coroutine(expert_backward(
            expert.uid, inputs, (serialize_torch_tensor(t, d.compression) for t, d in zip(inputs, schema)), expert.stub))
        self.assertEqual([g.dtype for g in grads], [torch.float32, torch.int64])
        self.assertTrue(torch.equal(grads[1], torch.zeros_like(mask)))

        # A float32 mask, what a client of moehost's earlier det_dropout sent, is refused naming the input.
        with self.assertRaises(P2PHandlerError) as e:
            RemoteExpertWorker.run_coroutine(expert_forward(
                expert.uid, (x.detach(), mask.float()),
                (serialize_torch_tensor(t) for t in (x.detach(), mask.float())), expert.stub))
        self.assertIn("ValueError", str(e.exception))
        self.assertIn("input 1: dtype float32, want mask:int64[-1,16]", str(e.exception))

    def test_transformer_bool_mask(self):
        server, dht = self.serve("transformer", "transformer.[0:1]")
        (expert,) = find(dht, ["transformer.0"])
        self.assert_schema_is_hiveminds(expert, "transformer")
        seq = expert.info["forward_schema"][0][0].shape[1]
        # moehost's transformer is torch's encoder layer with the exact GELU, post-norm, without dropout.
        local = torch.nn.TransformerEncoderLayer(HID, 16, dim_feedforward=4 * HID, dropout=0.0, activation="gelu",
                                                 batch_first=True)
        local.load_state_dict(server.parameters(expert.uid), strict=True)
        torch.manual_seed(4)
        x = torch.randn(2, seq, HID, requires_grad=True)
        pad = torch.zeros(2, seq, dtype=torch.bool)
        pad[0, -5:] = True  # sample 0 pads its last 5 positions
        out = expert(x, pad)
        x_local = x.detach().clone().requires_grad_(True)
        want = local(x_local, src_key_padding_mask=pad)
        self.assertLessEqual((out - want).abs().max().item(), 1e-4)
        self.assertGreater((out - local(x.detach())).abs().max().item(), 1e-3)  # the mask matters
        w = torch.randn(2, seq, HID)
        (out * w).sum().backward()
        (want * w).sum().backward()
        self.assertLessEqual((x.grad - x_local.grad).abs().max().item(), 1e-3)

        # A bool is 0 or 1: a raw byte of 2 under dtype "bool" is refused naming the input.
        buf = bytearray(pad.numpy().tobytes())
        buf[3] = 2
        bad = runtime_pb2.Tensor(compression=runtime_pb2.CompressionType.NONE, buffer=bytes(buf), size=list(pad.shape),
                                 dtype="bool")
        with self.assertRaises(P2PHandlerError) as e:
            RemoteExpertWorker.run_coroutine(expert_forward(
                expert.uid, (x.detach(), pad), iter([serialize_torch_tensor(x.detach()), bad]), expert.stub))
        self.assertIn("ValueError", str(e.exception))
        self.assertIn(f"input 1: bool element 3 is 2, want 0 or 1 (key_padding_mask:bool[-1,{seq}])", str(e.exception))
        self.assertTrue(server.alive())

    def test_nop_delay(self):
        server, dht = self.serve("nop_delay", "nop_delay.[0:2].[0:2]")
        experts = find(dht, ["nop_delay.0.0", "nop_delay.0.1", "nop_delay.1.0", "nop_delay.1.1"])
        self.assert_schema_is_hiveminds(experts[0], "nop_delay")
        x = torch.randn(3, HID)
        start = time.monotonic()
        out = experts[0](x)
        took = time.monotonic() - start
        self.assertTrue(torch.equal(out, x))
        self.assertGreaterEqual(took, 0.5)  # hivemind's DelayedNopExpert sleeps 0.5 s
        # hivemind's own tests/test_moe.py test_no_experts: a switch mixture with 0.1 s timeouts over experts that
        # are all slower gets zero outputs and still runs backward.
        moe = RemoteSwitchMixtureOfExperts(in_features=HID, grid_size=(2, 2), dht=dht, uid_prefix="nop_delay.",
                                           forward_timeout=0.1, backward_timeout=0.1, allow_zero_outputs=True)
        for _ in range(2):
            inp = torch.randn(10, HID)
            out, balancing_loss = moe(inp)
            # No expert answered in time: the mixture is its residual connection alone.
            self.assertTrue(torch.equal(out, inp))
            out.sum().backward()
        self.assertTrue(server.alive())


def train(dht, seed, steps=50):
    """A 2x2 mixture learns a fixed random map; returns the losses."""
    torch.manual_seed(seed)
    moe = RemoteMixtureOfExperts(in_features=HID, grid_size=(2, 2), dht=dht, uid_prefix="ffn.", k_best=2,
                                 forward_timeout=60, backward_timeout=60)
    target = torch.nn.Linear(HID, HID)
    opt = torch.optim.Adam(moe.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, HID)
        with torch.no_grad():
            y = torch.nn.functional.layer_norm(target(x), (HID,))
        loss = torch.nn.functional.mse_loss(moe(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


class TrainingTest(unittest.TestCase):
    def test_loss_falls_as_on_hivemind(self):
        falls = {}
        server = Moehost("ffn.[0:2].[0:2]", "--optimizer", "adam", "--lr", "0.001")
        try:
            dht = hivemind.DHT(initial_peers=server.maddrs, start=True, **P2P)
            find(dht, GRID)
            losses = train(dht, seed=0)
            dht.shutdown()
        finally:
            server.stop()
        falls["moehost"] = (np.mean(losses[:5]), np.mean(losses[-5:]))
        with background_server(num_experts=4, expert_pattern="ffn.[0:2].[0:2]", expert_cls="ffn", hidden_dim=HID,
                               num_handlers=2, device="cpu", **P2P) as info:
            dht = hivemind.DHT(initial_peers=info.addrs, start=True, **P2P)
            find(dht, GRID)
            losses = train(dht, seed=0)
            dht.shutdown()
        falls["hivemind"] = (np.mean(losses[:5]), np.mean(losses[-5:]))
        print("\n  loss first 5 → last 5 steps:", {k: f"{a:.4f} → {b:.4f}" for k, (a, b) in falls.items()}, file=sys.stderr)
        for k, (first, last) in falls.items():
            self.assertLess(last, 0.8 * first, k)
        # moehost's fall is within a factor 1.5 of hivemind's, on the same seed.
        ratio = lambda k: falls[k][1] / falls[k][0]
        self.assertLess(ratio("moehost"), 1.5 * ratio("hivemind") + 0.05)


class MixedSwarmTest(unittest.TestCase):
    def test_mixture_uses_both_servers(self):
        with background_server(num_experts=2, expert_pattern="ffn.0.[0:2]", expert_cls="ffn", hidden_dim=HID,
                               num_handlers=2, device="cpu", update_period=2, **P2P) as info:
            server = Moehost("ffn.1.[0:2]", "--hivemind-initial-peers", ",".join(str(a) for a in info.addrs))
            try:
                # moehost is the client's only initial peer.
                dht = hivemind.DHT(initial_peers=server.maddrs, start=True, **P2P)
                experts = find(dht, GRID)
                owners = {e.uid: str(e.peer_id) for e in experts}
                self.assertEqual(owners["ffn.0.0"], owners["ffn.0.1"])
                self.assertEqual(owners["ffn.1.0"], server.maddrs[0].rsplit("/", 1)[-1])
                self.assertNotEqual(owners["ffn.0.0"], owners["ffn.1.0"])
                for e in experts:  # each reachable by its peer ID alone
                    self.assertEqual(e(torch.randn(2, HID)).shape, (2, HID))
                moe = RemoteMixtureOfExperts(in_features=HID, grid_size=(2, 2), dht=dht, uid_prefix="ffn.", k_best=4)
                x = torch.randn(4, HID, requires_grad=True)
                moe(x).pow(2).sum().backward()
                self.assertGreater(x.grad.abs().sum().item(), 0)
                dht.shutdown()
            finally:
                server.stop()


if __name__ == "__main__":
    unittest.main()
