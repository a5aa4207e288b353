"""examples/gpt, run the way a user does: a tiny GPT trained for 20 steps on a small text learns
(its loss falls well below ln 256, the untrained model's), validates, and prints a sample that
is valid UTF-8; a vocabulary too small for bytes is refused with a HINT. About 3 s on 2 cores."""
import random

import pytest

from volt_e2e import assert_clean_exit, assert_ok, example_binary, merge_flags, read_metrics_csv, run_binary

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


@pytest.mark.compat
def test_a_tiny_gpt_learns_validates_and_prints_a_sample(gpt, text, tmp_path):
    run = run_binary(gpt, ["--text", str(text), "--max-steps", "20", "--val-check-interval", "10",
                           "--sample-tokens", "40"] + TINY, tmp_path, timeout=60)
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
