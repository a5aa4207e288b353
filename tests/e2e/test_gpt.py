"""examples/gpt, run the way a user does: a tiny GPT trained for 20 steps on a small text learns
(its loss falls well below ln 256, the untrained model's), validates, and prints a sample that
is valid UTF-8, and its checkpoint converts to safetensors (`volt checkpoint to-safetensors`); a
vocabulary too small for bytes and misused Hugging Face flags are refused with a HINT. About 8 s
on 2 cores."""
import os
import random
import subprocess
from pathlib import Path

import pytest

from volt_e2e import (assert_clean_exit, assert_ok, example_binary, load_checkpoint, merge_flags, read_metrics_csv,
                      run_binary)
from volt_testkit import import_from

SAFETENSORS_PATH = Path(os.environ.get("VOLT_SAFETENSORS_PYTHONPATH", "/opt/volt/python-safetensors"))

# A model of 35 K parameters on 32-byte windows: 20 steps take well under a second.
TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "32", "--batch-size", "8",
        "--lr", "1e-2", "--warmup-steps", "2", "--seed", "1", "--num-threads", "1", "--no-progress-bar",
        "--log-every-n-steps", "1"]


@pytest.fixture(scope="module")
def gpt():
    return example_binary("VOLT_GPT_EXAMPLE", "gpt")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """22 KB of sentences over a 23-word vocabulary: enough structure to learn in 20 steps."""
    rng = random.Random(0)
    words = ("the quick brown fox jumps over the lazy dog while a small cat sleeps in the warm sun near an old red "
             "barn").split()
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text("".join(" ".join(rng.choice(words) for _ in range(12)) + ".\n" for _ in range(400)))
    return path


@pytest.fixture(scope="module")
def trained(gpt, text, tmp_path_factory):
    """The tiny GPT's 20 steps, shared by the tests that read what the run printed and wrote."""
    return run_binary(gpt, ["--text", str(text), "--max-steps", "20", "--val-check-interval", "10",
                            "--sample-tokens", "40"] + TINY, tmp_path_factory.mktemp("trained"), timeout=60)


@pytest.mark.compat
def test_a_tiny_gpt_learns_validates_and_prints_a_sample(trained):
    run = trained
    assert_ok(run)
    _, rows = read_metrics_csv(run.version_dir(0) / "metrics.csv")
    losses = [float(r["train/loss_step"]) for r in rows if r.get("train/loss_step")]
    assert len(losses) == 20, rows
    assert losses[0] > 5.3, losses  # ln 256 = 5.55: the untrained model guesses uniformly
    assert losses[-1] < losses[0] - 1.5, losses  # measured, seeds 1-3: 5.53-5.55 -> 3.02-3.19
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(val) == 2 and val[-1] < 4.0, val  # measured, seeds 1-3: 3.03-3.05
    assert "sample (--prompt continued by 40 bytes):" in run.stdout, repr(run)


def test_a_vocabulary_too_small_for_bytes_is_refused_with_a_hint(gpt, text, tmp_path):
    # The model's own refusals (sizes, token ids, context) are unit tests (gpt_test).
    run = run_binary(gpt, merge_flags(["--text", str(text), "--max-steps", "1"], TINY, ["--vocab-size", "100"]),
                     tmp_path, timeout=60)
    assert_clean_exit(run)
    assert run.returncode != 0, repr(run)
    for phrase in ["--vocab-size=100 is too small for byte tokens", "HINT"]:
        assert phrase in run.stderr, f"{phrase!r} not on stderr: {run!r}"


def test_hugging_face_flags_refuse_size_flags_and_folders_without_config(gpt, tmp_path):
    # Exported with --no-train (no fit), then loaded: the folder's config.json sets the size, so a
    # size flag beside --init-from is refused; so is a folder without config.json. Transformers'
    # side is tests/interop/test_gpt_hf_interop.py.
    small = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
    assert_ok(run_binary(gpt, ["--no-train", "--export-hf", str(tmp_path / "hf")] + small, tmp_path, timeout=60))
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]
    (tmp_path / "empty").mkdir()
    for args, phrases in [
        (["--init-from", str(tmp_path / "hf"), "--n-embd", "32"], ["--n-embd were both given", "HINT"]),
        (["--init-from", str(tmp_path / "hf"), "--eval-tokens", "t.npy", "--block-size", "17"],
         ["--block-size=17 cannot cut --eval-tokens windows: expected 2..16", "HINT"]),
        (["--init-from", str(tmp_path / "empty")], ["has no config.json", "HINT"]),
    ]:
        run = run_binary(gpt, args + ["--no-train"], tmp_path, timeout=60)
        assert_clean_exit(run)
        assert run.returncode != 0, repr(run)
        for phrase in phrases:
            assert phrase in run.stderr, f"{phrase!r} not on stderr: {run!r}"


def test_volt_checkpoint_writes_the_state_dict_as_safetensors(trained, tmp_path):
    # `volt checkpoint to-safetensors` (run by volt-checkpoint, beside volt) on the run's last
    # checkpoint: every state_dict tensor, named as stored, read back by PyPI's safetensors.
    assert_ok(trained)
    safetensors, _ = import_from(SAFETENSORS_PATH, "safetensors", "safetensors.torch")
    ckpt = trained.version_dir(0) / "checkpoints" / "last.ckpt"
    out = tmp_path / "weights.safetensors"
    tool = os.environ.get("VOLT_TOOL")
    assert tool, "VOLT_TOOL is not set: run this through ctest (ctest -R e2e_gpt)"
    run = subprocess.run([tool, "checkpoint", "to-safetensors", str(ckpt), str(out)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    state_dict = load_checkpoint(ckpt)["state_dict"]
    assert "transformer.h.1.attn.c_attn.weight" in state_dict
    assert f"wrote the {len(state_dict)} tensors" in run.stdout, run.stdout
    written = safetensors.torch.load_file(out)
    assert sorted(written) == sorted(state_dict)
    for name, tensor in state_dict.items():
        assert written[name].dtype == tensor.dtype and written[name].equal(tensor), name
    with safetensors.safe_open(str(out), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    # Not a checkpoint: refused with a HINT, through the same exit codes as every Volt program.
    run = subprocess.run([tool, "checkpoint", "to-safetensors", str(out), str(tmp_path / "x.safetensors")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "HINT" in run.stderr, (run.returncode, run.stderr)
