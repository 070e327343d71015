"""README's "Training state": the three lines that load an export into
PyTorch, run as the README writes them, reproduce the server's Forward;
a transformer expert's export loads into moehost.layers.TransformerBlock
and reproduces its Forward too; and the safetensors reader refuses a
malformed file.

Run by `make test-python`; the test starts `moehost serve` itself.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

import torch

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, here)

import moehost  # noqa: E402
from moehost import safetensors  # noqa: E402
from moehost.layers import TransformerBlock  # noqa: E402
from serve import Server  # noqa: E402

HIDDEN = 16
README = os.path.join(here, "..", "..", "..", "README.md")


def readme_lines():
    """The python block of README's "Training state" section."""
    with open(README) as f:
        text = f.read()
    section = text[text.index("## Training state"):]
    section = section[:section.index("\n## ", 1)]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    if m is None:
        raise AssertionError("README's Training state section has no python block")
    return m.group(1)


class TrainingStateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--experts", "ffn.0", "--hidden-dim", str(HIDDEN), "--no-dht", "--no-checkpoints")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_readme_lines_reproduce_forward(self):
        torch.manual_seed(5)
        expert = moehost.RemoteExpert("ffn.0", "http://" + self.server.addr)
        x = torch.randn(4, HIDDEN)
        ((expert(x.requires_grad_(True)) - torch.randn(4, HIDDEN)) ** 2).mean().backward()  # train a step first
        want = expert(x.detach()).detach()
        lines = readme_lines()
        self.assertEqual(len(lines.strip().splitlines()), 3, lines)
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([os.environ.get("MOEHOST_BIN", "moehost"), "checkpoint", "--server", self.server.addr,
                            "export", "ffn.0"], cwd=d, check=True, capture_output=True)
            env = {}
            cwd = os.getcwd()
            os.chdir(d)
            try:
                exec(lines.replace("1024", str(HIDDEN)), env)
            finally:
                os.chdir(cwd)
        got = env["block"](x.detach()).detach()
        self.assertLess((got - want).abs().max().item(), 1e-4, "the loaded block's Forward differs from the server's")

    def test_malformed_files_are_refused(self):
        good = b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
        blob = len(good).to_bytes(8, "little") + good + b"\0" * 8
        tensors, _ = safetensors.load(blob)
        self.assertEqual(tuple(tensors["w"].shape), (2,))
        for name, data in [
            ("short", b"\1\0"),
            ("header past the end", (1 << 40).to_bytes(8, "little") + b"{}"),
            ("data past the end", blob[:-4]),
            ("dtype", blob.replace(b"F32", b"X32")),
        ]:
            with self.subTest(name):
                with self.assertRaises(ValueError):
                    safetensors.load(data)


# The transformer expert's defaults: seq_len 128 and 16 heads, so that a
# hidden_dim of 32 gives heads of 2.
T_HIDDEN, T_SEQ, T_HEADS = 32, 128, 16


class TransformerExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--module", "transformer", "--experts", "tf.0", "--hidden-dim", str(T_HIDDEN),
                            "--no-dht", "--no-checkpoints")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_export_reproduces_forward(self):
        torch.manual_seed(7)
        expert = moehost.RemoteExpert("tf.0", "http://" + self.server.addr)
        x = torch.randn(3, T_SEQ, T_HIDDEN)
        # Padding at the ends of two of the three sequences.
        mask = torch.zeros(3, T_SEQ, dtype=torch.bool)
        mask[1, 100:] = True
        mask[2, 5:] = True
        # Two optimizer steps first, so that no parameter is at its
        # initial value (the biases start at zero).
        for _ in range(2):
            ((expert(x.requires_grad_(True), mask) - torch.randn(3, T_SEQ, T_HIDDEN)) ** 2).mean().backward()
        want = expert(x.detach(), mask).detach()
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([os.environ.get("MOEHOST_BIN", "moehost"), "checkpoint", "--server", self.server.addr,
                            "export", "tf.0"], cwd=d, check=True, capture_output=True)
            state = safetensors.load_file(os.path.join(d, "tf.0.safetensors"))
        block = TransformerBlock(T_HIDDEN, T_HEADS).eval()
        block.load_state_dict(state, strict=True)
        self.assertNotEqual(state["self_attn.in_proj_bias"].abs().max().item(), 0, "no step was trained")
        with torch.no_grad():
            got = block(x.detach(), mask)
        self.assertEqual(tuple(got.shape), (3, T_SEQ, T_HIDDEN))
        err = (got - want).abs().max().item()
        self.assertLess(err, 1e-5, f"the loaded block's Forward differs from the server's by {err}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
