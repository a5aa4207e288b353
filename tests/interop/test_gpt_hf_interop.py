"""examples/gpt and Hugging Face's transformers understand each other's GPT-2 weights.

Run by CTest (test `gpt_hf_interop_py`), which sets VOLT_GPT_EXAMPLE to the built `gpt` and
PYTHONPATH to PyPI's transformers and torch 2.x (scripts/setup.sh installs them into folders of
their own, /opt/volt/python-transformers and /opt/volt/python-torchrun; Debian's torch 1.13 is too
old for transformers). One random GPT2LMHeadModel, saved as the hub has such folders (plain, sharded,
without the `transformer.` prefix, with lm_head.weight and the old mask buffers), loads into Volt with
the loss transformers computes on the same windows; Volt's exports load into transformers with no
missing or unexpected keys and the same logits. About 10 s on 2 cores, most of it importing
transformers.
"""
import logging
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from volt_testkit import require

# Debian's torchvision (built for torch 1.13) is on the path too; transformers would import it.
sys.modules["torchvision"] = None

GPT = os.environ.get("VOLT_GPT_EXAMPLE")
TRANSFORMERS_PATH = Path(os.environ.get("VOLT_TRANSFORMERS_PYTHONPATH", "/opt/volt/python-transformers"))
require((TRANSFORMERS_PATH / "transformers").is_dir(),
        f"transformers is not installed in {TRANSFORMERS_PATH}: run scripts/setup.sh")
try:
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as error:
    require(False, f"transformers does not import (PYTHONPATH={os.environ.get('PYTHONPATH')}): {error}")

BLOCK = 48  # windows of 48 tokens; the model's context is 64
TOLERANCE = 1e-5


def run_gpt(*args, cwd):
    assert GPT, "VOLT_GPT_EXAMPLE is not set: run this through ctest (ctest -R gpt_hf_interop_py)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_"))}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run([GPT, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    assert result.returncode == 0, f"gpt {' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def eval_loss(stdout):
    match = re.search(r"^eval loss (\S+)$", stdout, re.MULTILINE)
    assert match, stdout
    return float(match.group(1))


def hf_loss(model, tokens):
    """GPT2LMHeadModel's mean loss over the non-overlapping BLOCK windows of `tokens` (the last partial one dropped)."""
    windows = torch.as_tensor(tokens[:len(tokens) // BLOCK * BLOCK].astype(np.int64)).view(-1, BLOCK)
    with torch.no_grad():
        return model(input_ids=windows, labels=windows).loss.item()


def load_quietly(folder):
    """GPT2LMHeadModel.from_pretrained(folder), failing on any load report (missing, unexpected or
    mismatched keys), whether transformers logs it or returns it."""
    messages = []

    class Record(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Record()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        model, info = GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    finally:
        logger.removeHandler(handler)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    reports = [m for m in messages if re.search(r"LOAD REPORT|missing|unexpected|newly initialized|not used", m, re.I)]
    assert not reports, reports
    return model.eval()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A random GPT2LMHeadModel saved as the hub's folders are, and random token ids."""
    root = tmp_path_factory.mktemp("hub")
    torch.manual_seed(0)
    # Weights 10x GPT-2's initial scale: logits far from uniform, so that a misplaced tensor shows.
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=300, n_positions=64, initializer_range=0.2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(root / "plain")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    plain = load_file(root / "plain" / "model.safetensors")
    config_json = (root / "plain" / "config.json").read_text()
    # GPT2Model's names (no prefix), as e.g. the original `gpt2` repository has them.
    (root / "no_prefix").mkdir()
    save_file({k.removeprefix("transformer."): v for k, v in plain.items()}, root / "no_prefix" / "model.safetensors",
              metadata={"format": "pt"})
    (root / "no_prefix" / "config.json").write_text(config_json)
    # lm_head.weight (a copy of wte) and the mask buffers older transformers saved.
    (root / "old").mkdir()
    old = dict(plain, **{"lm_head.weight": plain["transformer.wte.weight"].clone()})
    for i in range(2):
        old[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
        old[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(old, root / "old" / "model.safetensors", metadata={"format": "pt"})
    (root / "old" / "config.json").write_text(config_json)
    tokens = np.random.default_rng(0).integers(0, 300, size=5 * BLOCK + 17).astype(np.int32)
    np.save(root / "tokens.npy", tokens)
    loss = hf_loss(model, tokens)
    assert loss > 6.0, loss  # measured 6.38; ln 300 = 5.70 is the uniform guess
    return {"root": root, "model": model, "tokens": tokens, "loss": loss}


def test_volt_loads_the_hubs_folders_with_transformers_loss_and_exports_what_transformers_loads(hub, tmp_path):
    assert len(list((hub["root"] / "sharded").glob("model-*.safetensors"))) > 1  # it did shard
    for variant in ["sharded", "no_prefix", "old"]:
        out = run_gpt("--init-from", hub["root"] / variant, "--no-train", "--eval-tokens", hub["root"] / "tokens.npy",
                      "--block-size", BLOCK, cwd=tmp_path)
        assert abs(eval_loss(out) - hub["loss"]) < TOLERANCE, (variant, out, hub["loss"])
    # The plain folder, evaluated and exported in one run.
    out = run_gpt("--init-from", hub["root"] / "plain", "--no-train", "--eval-tokens", hub["root"] / "tokens.npy",
                  "--block-size", BLOCK, "--export-hf", tmp_path / "export", cwd=tmp_path)
    assert abs(eval_loss(out) - hub["loss"]) < TOLERANCE, (out, hub["loss"])
    exported = load_quietly(tmp_path / "export")
    ids = torch.as_tensor(hub["tokens"][:64].astype(np.int64)).view(1, 64)
    with torch.no_grad():
        expected, got = hub["model"](ids).logits, exported(ids).logits
    assert (expected - got).abs().max().item() < TOLERANCE


def test_a_volt_trained_export_has_the_same_loss_in_transformers(tmp_path):
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog near an old red barn".split()
    text = "".join(" ".join(rng.choice(words) for _ in range(10)) + ".\n" for _ in range(60))
    (tmp_path / "text.txt").write_text(text)
    tokens = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint16)  # byte tokens, stored as uint16
    np.save(tmp_path / "bytes.npy", tokens)
    eval_args = ["--eval-tokens", tmp_path / "bytes.npy", "--block-size", BLOCK]
    trained = run_gpt("--text", tmp_path / "text.txt", "--max-steps", "3", "--n-layer", "2", "--n-head", "2",
                      "--n-embd", "32", "--block-size", "64", "--batch-size", "4", "--lr", "1e-2", "--seed", "1",
                      "--sample-tokens", "0", "--num-threads", "1", "--no-progress-bar", "--export-hf",
                      tmp_path / "trained", "--eval-tokens", tmp_path / "bytes.npy", cwd=tmp_path)
    assert "exported the model to" in trained
    reloaded = run_gpt("--init-from", tmp_path / "trained", "--no-train", *eval_args, cwd=tmp_path)
    model = load_quietly(tmp_path / "trained")
    assert abs(eval_loss(reloaded) - hf_loss(model, tokens)) < TOLERANCE, reloaded
    # Trained: no longer the uniform guess of an untrained model (ln 256 = 5.55).
    assert eval_loss(reloaded) < 5.3, reloaded
