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
  hf_logits_check.py same THEIRS OURS
      checks that every tensor of the safetensors file THEIRS is in OURS (names with or
      without "transformer."), bit for bit; a THEIRS without lm_head (tied) must have OURS's
      lm_head equal to its wte.

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
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=249, eos_token_id=249)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Gains near 1, everything else spread: a transposed or misplaced tensor shows.
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "ln" in name and "weight" in name else 0.0))
    model.save_pretrained(model_dir)  # model.safetensors (the default since transformers 4.35)
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


def same(theirs_path, ours_path):
    def strip(name):
        return name[len("transformer."):] if name.startswith("transformer.") else name
    theirs = {strip(k): v for k, v in load_file(theirs_path).items()}
    ours = {strip(k): v for k, v in load_file(ours_path).items()}
    if "lm_head.weight" not in theirs:
        theirs["lm_head.weight"] = theirs["wte.weight"]
    for name, t in theirs.items():
        if name not in ours:
            sys.exit("FAILED: %s has no %s" % (ours_path, name))
        if ours[name].shape != t.shape or not torch.equal(ours[name], t.float()):
            sys.exit("FAILED: %s differs (%s against %s)" % (name, tuple(ours[name].shape), tuple(t.shape)))
    print("%s: all %d tensors of %s, bit for bit" % (ours_path, len(theirs), theirs_path))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "same":
        same(sys.argv[2], sys.argv[3])
    else:
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
