"""Tandem's GPT against Hugging Face transformers' GPT2LMHeadModel on the same weights.

  hf_logits_check.py make DIR
      writes a GPT2LMHeadModel of transformers' own making (random weights, biases and
      LayerNorm gains too, its head tied to wte as GPT-2's) to DIR (model.safetensors and
      config.json, save_pretrained), for Tandem to load.
  hf_logits_check.py compare DIR TOKENS TANDEM_LOGITS
      loads DIR with GPT2LMHeadModel.from_pretrained, computes the logits of the rows of
      TOKENS (a text file, one row of token ids a line) and compares them with Tandem's
      ([rows, tokens, vocab] in the safetensors file TANDEM_LOGITS): the largest difference
      must be within 1e-4 of the largest logit's magnitude.

Needs torch and transformers (pip install torch transformers).
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

TOLERANCE = 1e-4


def load(model_dir):
    try:  # the plain attention, as GPT-2 wrote it
        return GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager")
    except (TypeError, ValueError):
        return GPT2LMHeadModel.from_pretrained(model_dir)


def make(model_dir):
    torch.manual_seed(1234)
    config = GPT2Config(vocab_size=250, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Gains near 1, everything else spread: a transposed or misplaced tensor shows.
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "ln" in name and "weight" in name else 0.0))
    model.save_pretrained(model_dir, safe_serialization=True)
    print("wrote a transformers GPT2LMHeadModel to %s" % model_dir)


def compare(model_dir, tokens_path, tandem_path):
    torch.set_num_threads(1)
    rows = [[int(w) for w in line.split()] for line in open(tokens_path) if line.strip()]
    model = load(model_dir)
    model.eval()
    with torch.no_grad():
        theirs = model(torch.tensor(rows)).logits.float()
    ours = load_file(tandem_path)["logits"]
    if tuple(ours.shape) != tuple(theirs.shape):
        sys.exit("FAILED: Tandem's logits are %s, transformers' %s" % (tuple(ours.shape), tuple(theirs.shape)))
    diff = (ours - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    print("%s: logits %s, largest |difference| %.3g, largest |logit| %.3g, relative %.3g (tolerance %g)"
          % (model_dir, tuple(theirs.shape), diff, scale, diff / scale, TOLERANCE))
    if not diff <= TOLERANCE * scale:
        sys.exit("FAILED: Tandem's logits differ from transformers' by %.3g relative" % (diff / scale))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
