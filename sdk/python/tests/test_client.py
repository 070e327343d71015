"""moehost.Client, the calls of ServerService and ModuleService: against a
live `moehost serve --tenants` on a fresh data dir (server info, an
upload of the Go ffn in chunks, a deployment with options, Forward on it,
listing, undeploying, deleting, and the refusals, each with its class and
the server's words), and against an in-process fake ModuleService that
records what the client sends (the chunks, the deploy request, the
token).

Run by `make test-python`; the test starts `moehost serve` itself.
"""

import datetime
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import threading
import unittest
from concurrent import futures
from unittest import mock

import grpc
import torch

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, here)

import moehost  # noqa: E402
from moehost.v1 import module_pb2, module_pb2_grpc  # noqa: E402
from serve import Server, add_tenant  # noqa: E402

HIDDEN = 8
EXAMPLES = os.path.join(here, "..", "..", "..", "examples", "wasm-experts")
FFN = os.path.join(EXAMPLES, "ffn", "ffn.wasm")  # the Go ffn: 1.9 MB, two chunks
FFN_C = os.path.join(EXAMPLES, "ffn-c", "ffn-c.wasm")  # the C ffn: 4 kB
CAP = 3 << 20  # the server's --max-upload-bytes
MiB = 1 << 20


def digest_of(path: str) -> str:
    with open(path, "rb") as f:
        return "sha256:" + hashlib.sha256(f.read()).hexdigest()


class Unseekable(io.RawIOBase):
    """A stream of n zero bytes that cannot tell its length."""

    def __init__(self, n: int):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


class LiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Class cleanups run even when setUpClass fails after the server
        # started, which tearDownClass would not.
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        tenants = os.path.join(cls.tmp.name, "tenants.json")
        cls.alice = add_tenant(tenants, "alice", "alice")
        cls.bob = add_tenant(tenants, "bob", "bob")
        cls.server = Server("--tenants", tenants, "--experts", "ffn.0", "--module", "ffn-c", "--hidden-dim", str(HIDDEN),
                            "--no-checkpoints", "--no-dht", "--max-upload-bytes", str(CAP))
        cls.addClassCleanup(cls.server.stop)
        cls.client = moehost.Client(cls.server.addr, token=cls.alice)
        cls.addClassCleanup(cls.client.close)
        # An expert that stays deployed, for the refusals that need one.
        cls.pinned = cls.client.upload_module(FFN_C)
        cls.client.deploy("alice.pinned", cls.pinned, config={"hidden_dim": HIDDEN})

    def test_server_info(self):
        version = subprocess.run([os.environ.get("MOEHOST_BIN", "moehost"), "version"], check=True,
                                 capture_output=True, text=True).stdout.split()  # moehost VERSION COMMIT GO
        with moehost.Client("http://" + self.server.addr, token="") as anonymous:
            info = anonymous.server_info()
        self.assertEqual(info.version, version[1])
        self.assertEqual(info.go_version, version[3])
        self.assertEqual(info.listen_address, self.server.addr)
        self.assertEqual(info.expert_count, len(self.client.experts()))
        self.assertGreaterEqual(info.expert_count, 2, "ffn.0 and alice.pinned")
        self.assertEqual([d.name for d in info.devices], ["cpu"])
        self.assertTrue(info.HasField("start_time"))
        self.assertGreater(info.uptime_seconds, 0)
        self.assertEqual((info.peer_id, list(info.dht_addresses)), ("", []), "--no-dht")

    def test_upload_deploy_forward_undeploy(self):
        c = self.client
        mod = c.upload_module(FFN)
        self.assertEqual((mod.digest, mod.size_bytes, mod.name), (digest_of(FFN), os.path.getsize(FFN), "ffn.wasm"))
        with open(FFN, "rb") as f:
            data = f.read()
        with open(FFN, "rb") as f:
            again = [c.upload_module(data, name="ffn-again"), c.upload_module(f)]
        self.assertEqual([m.digest for m in again], [mod.digest] * 2, "the same bytes are the same module")
        self.assertIn((mod.digest, []), [(m.digest, list(m.experts)) for m in c.modules()])

        uids = c.deploy("alice.ffn.[0:2]", mod, config={"hidden_dim": HIDDEN}, optimizer={"name": "sgd", "lr": 0.1},
                        batching={"max_batch_size": 7, "max_wait": 0.003}, limits={"call_timeout": 5},
                        forward_access="owner")
        self.assertEqual(uids, ["alice.ffn.0", "alice.ffn.1"])
        infos = {e.uid: e for e in c.experts()}
        for uid in uids:
            e = infos[uid]
            self.assertEqual((e.owner, e.module_digest, dict(e.config)), ("alice", mod.digest, {"hidden_dim": HIDDEN}))
            self.assertEqual((e.forward_pool.max_batch_size, e.forward_pool.max_wait_ms), (7, 3.0))
        self.assertEqual([list(m.experts) for m in c.modules() if m.digest == mod.digest], [uids])

        x = torch.randn(3, HIDDEN)
        y = c.expert("alice.ffn.0")(x)
        self.assertEqual(tuple(y.shape), (3, HIDDEN))
        self.assertTrue(torch.isfinite(y).all())
        with self.assertRaisesRegex(moehost.UnauthenticatedError, "needs a token"):
            c.expert("alice.ffn.0", token="")(x)  # forward_access="owner"

        self.assertEqual(c.undeploy("alice.ffn.[0:2]"), uids)
        self.assertFalse(set(uids) & {e.uid for e in c.experts()})
        c.delete_module(mod)
        self.assertNotIn(mod.digest, [m.digest for m in c.modules()])

    def test_refusals(self):
        c = self.client
        tests = [
            ("unknown token", lambda: moehost.Client(self.server.addr, token="nope").upload_module(FFN_C),
             moehost.UnauthenticatedError, r"^unauthenticated: the bearer token is not valid on this server$"),
            ("unknown token, server info", lambda: moehost.Client(self.server.addr, token="nope").server_info(),
             moehost.UnauthenticatedError, "the bearer token is not valid"),
            ("no token", lambda: moehost.Client(self.server.addr, token="").modules(),
             moehost.UnauthenticatedError, r"ModuleService needs a token \(Authorization: Bearer <token>\)"),
            ("not a module", lambda: c.upload_module(b"not wasm at all", name="junk.wasm"),
             moehost.InvalidArgumentError, r"invalid expert module sha256:[0-9a-f]{64}: not a WebAssembly binary"),
            ("empty", lambda: c.upload_module(b""), moehost.InvalidArgumentError, "size_bytes 0 is not positive"),
            ("over the cap, declared", lambda: c.upload_module(bytes(CAP + 1)),
             moehost.ResourceExhaustedError, f"the module's {CAP + 1} bytes exceed this server's upload cap of 3 MiB"),
            ("over the cap, streamed", lambda: c.upload_module(io.BufferedReader(Unseekable(CAP + MiB))),
             moehost.ResourceExhaustedError, "the module exceeds this server's upload cap of 3 MiB"),
            ("outside the prefixes", lambda: c.deploy("bob.ffn.0", self.pinned, config={"hidden_dim": HIDDEN}),
             moehost.PermissionDeniedError, r"\"bob.ffn.0\" is outside tenant \"alice\"'s prefixes"),
            ("a config key the module does not read", lambda: c.deploy("alice.typo", self.pinned, config={"hiden_dim": 8}),
             moehost.InvalidArgumentError, r"unknown config key: \"hiden_dim\".* \(it reads: hidden_dim\)"),
            ("a path for a digest", lambda: c.deploy("alice.x", FFN_C),
             moehost.InvalidArgumentError, r"module digest \".*ffn-c.wasm\" is not \"sha256:\" and 64 lower-case hex digits"),
            ("another tenant's module", lambda: moehost.Client(self.server.addr, token=self.bob).deploy("bob.x", self.pinned),
             moehost.NotFoundError, self.pinned.digest + ": you have no such module; upload it first"),
            ("a module in use", lambda: c.delete_module(self.pinned),
             moehost.FailedPreconditionError, "is deployed .*undeploy its experts first"),
        ]
        for name, call, cls, pattern in tests:
            with self.subTest(name):
                with self.assertRaises(cls) as cm:
                    call()
                self.assertRegex(str(cm.exception), pattern)
                self.assertIsInstance(cm.exception, grpc.RpcError)
        self.assertIn("alice.pinned", [e.uid for e in c.experts()], "a refusal undeployed the pinned expert")
        # Mistakes the client catches before any call.
        with self.assertRaisesRegex(ValueError, "forward_access 'anyone' is not public, owner or tenants"):
            c.deploy("alice.y", self.pinned, forward_access="anyone")
        with self.assertRaisesRegex(TypeError, "a path, bytes or a binary file, not int"):
            c.upload_module(42)
        with self.assertRaises(FileNotFoundError):
            c.upload_module(os.path.join(self.tmp.name, "missing.wasm"))

    def test_module_service_needs_tenants(self):
        plain = Server("--experts", "ffn.0", "--module", "ffn-c", "--hidden-dim", str(HIDDEN), "--no-checkpoints", "--no-dht")
        self.addCleanup(plain.stop)
        with moehost.Client(plain.addr, token="") as c:
            self.assertEqual(c.server_info().expert_count, 1)
            with self.assertRaises(moehost.MoehostError) as cm:
                c.modules()
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        self.assertRegex(str(cm.exception), "this server serves no ModuleService .*--tenants")


class FakeModules(module_pb2_grpc.ModuleServiceServicer):
    """Records each upload's messages, each deploy request and the
    authorization metadata of every call."""

    def __init__(self):
        self.uploads, self.deploys, self.auth = [], [], []
        self.lock = threading.Lock()

    def _record_auth(self, context):
        with self.lock:
            self.auth.append([v for k, v in context.invocation_metadata() if k == "authorization"])

    def UploadModule(self, request_iterator, context):
        self._record_auth(context)
        msgs = list(request_iterator)
        with self.lock:
            self.uploads.append(msgs)
        return module_pb2.UploadModuleResponse(module=module_pb2.ModuleInfo(digest="sha256:" + "0" * 64))

    def DeployExpert(self, request, context):
        self._record_auth(context)
        with self.lock:
            self.deploys.append(request)
        return module_pb2.DeployExpertResponse(uids=[request.experts])

    def ListModules(self, request, context):
        self._record_auth(context)
        return module_pb2.ListModulesResponse()


class WireTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeModules()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        module_pb2_grpc.add_ModuleServiceServicer_to_server(self.fake, server)
        self.addr = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        self.addCleanup(server.stop, None)
        self.client = moehost.Client(self.addr, token="tok")
        self.addCleanup(self.client.close)

    def test_upload_is_chunked_and_declares_its_size(self):
        data = bytes(range(256)) * (10 * 1024) + b"tail"  # 2.5 MiB and 4 bytes
        path = os.path.join(tempfile.mkdtemp(), "m.wasm")
        self.addCleanup(os.remove, path)
        with open(path, "wb") as f:
            f.write(data)
        seekable = io.BytesIO(b"skip!" + data)
        seekable.seek(5)
        tests = [
            # name, module, upload's name=, the bytes, the name sent, size_bytes (None: not sent), chunk lengths
            ("path", path, None, data, "m.wasm", len(data), [MiB, MiB, len(data) - 2 * MiB]),
            ("bytes", data, "x", data, "x", len(data), [MiB, MiB, len(data) - 2 * MiB]),
            ("memoryview", memoryview(data), None, data, "", len(data), [MiB, MiB, len(data) - 2 * MiB]),
            ("seekable file, from its position", seekable, None, data, "", len(data), [MiB, MiB, len(data) - 2 * MiB]),
            ("unseekable stream", io.BufferedReader(Unseekable(MiB + 1)), "s", bytes(MiB + 1), "s", None, [MiB, 1]),
            ("one full chunk", bytes(MiB), None, bytes(MiB), "", MiB, [MiB]),
            ("empty", b"", None, b"", "", 0, [0]),
        ]
        for name, module, upload_name, want, want_name, size, lengths in tests:
            with self.subTest(name):
                self.fake.uploads.clear()
                self.client.upload_module(module, name=upload_name)
                [msgs] = self.fake.uploads
                self.assertEqual([len(m.chunk) for m in msgs], lengths)
                self.assertEqual(b"".join(m.chunk for m in msgs), want)
                self.assertEqual(msgs[0].name, want_name)
                self.assertEqual(msgs[0].size_bytes if msgs[0].HasField("size_bytes") else None, size)
                for m in msgs[1:]:
                    self.assertEqual((m.name, m.HasField("size_bytes")), ("", False), "only the first message names and sizes")

    def test_deploy_request(self):
        self.client.deploy(
            "alice.ffn.[0:4]", module_pb2.ModuleInfo(digest="sha256:" + "a" * 64), config={"hidden_dim": 16, "heads": 2},
            optimizer={"name": "adamw", "lr": 3e-4, "weight_decay": 0.01, "scheduler": "linear", "num_training_steps": 100},
            batching={"max_batch_size": 64, "min_batch_size": 2, "max_wait": 0.005, "queue_size": 9},
            limits={"call_timeout": datetime.timedelta(seconds=1.5), "bytes_per_call": 1 << 30, "param_bytes": 1 << 20,
                    "memory_pages": 512},
            forward_access="Tenants", backward_access="public",
        )
        self.client.deploy("alice.min", "sha256:" + "b" * 64)
        full, minimal = self.fake.deploys
        want = module_pb2.DeployExpertRequest(
            experts="alice.ffn.[0:4]", module_digest="sha256:" + "a" * 64, config={"hidden_dim": 16, "heads": 2},
            optimizer=module_pb2.OptimizerConfig(name="adamw", lr=3e-4, weight_decay=0.01, scheduler="linear",
                                                 num_training_steps=100),
            batching=module_pb2.BatchLimits(max_batch_size=64, min_batch_size=2, queue_size=9),
            limits=module_pb2.ExpertLimits(bytes_per_call=1 << 30, param_bytes=1 << 20, memory_pages=512),
            forward_access=module_pb2.ACCESS_TENANTS, backward_access=module_pb2.ACCESS_PUBLIC,
        )
        want.batching.max_wait.FromMilliseconds(5)
        want.limits.call_timeout.FromMilliseconds(1500)
        self.assertEqual(full, want)
        self.assertEqual(minimal, module_pb2.DeployExpertRequest(experts="alice.min", module_digest="sha256:" + "b" * 64))
        self.assertFalse(minimal.HasField("optimizer") or minimal.HasField("batching") or minimal.HasField("limits"),
                         "left out, they take the server's settings")

    def test_token(self):
        tests = [
            ("token=", "tok", None, ["Bearer tok"]),
            ("$MOEHOST_TOKEN", None, "envtok", ["Bearer envtok"]),
            ('token="" over $MOEHOST_TOKEN', "", "envtok", []),
            ("none", None, None, []),
        ]
        for name, token, env, want in tests:
            with self.subTest(name):
                with mock.patch.dict(os.environ):
                    os.environ.pop("MOEHOST_TOKEN", None)
                    if env is not None:
                        os.environ["MOEHOST_TOKEN"] = env
                    c = moehost.Client(self.addr, token=token)
                self.fake.auth.clear()
                c.modules()
                c.upload_module(b"\0asm")
                c.deploy("a", "sha256:" + "0" * 64)
                c.close()
                self.assertEqual(self.fake.auth, [want] * 3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
