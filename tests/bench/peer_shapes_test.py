"""bench/peers/shapes.py: the peers' shapes, named or given as a directory with a Hugging Face config.json. The
parameter counts are those transformers 4.57 builds for the same configs (LlamaForCausalLM, Qwen2ForCausalLM on the
meta device), so a peer's FLOPs and the summary's sizes count what the model has."""
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
import shapes  # noqa: E402


class PeerShapes(unittest.TestCase):
    def test_named_and_directory_shapes_count_what_transformers_builds(self):
        self.assertEqual(shapes.params("llama-8b"), 8030261248)
        self.assertEqual(shapes.params("llama-1b@1"), 323491840)
        qwen = os.path.join(ROOT, "bench", "shapes", "qwen2.5-32b")
        self.assertEqual(shapes.dims(qwen), (5120, 27648, 64, 40, 8, False))
        self.assertEqual(shapes.vocab(qwen), 152064)
        self.assertEqual(shapes.params(qwen), 32763876352)  # q/k/v biases included

    def test_unknown_shapes_are_refused_by_name(self):
        with tempfile.TemporaryDirectory() as empty:  # a directory without a config.json is no shape either
            for bad in ("llama-9b", "llama-8b@0", empty):
                with self.assertRaisesRegex(ValueError, "unknown shape"):
                    shapes.dims(bad)


if __name__ == "__main__":
    unittest.main()
