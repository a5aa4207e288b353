"""Bad input ends the run with a non-zero exit and a message that says what is wrong and what to do:
no signal, no backtrace, no 'internal error'."""
import pytest

from volt_e2e import assert_clean_exit, assert_ok, libtorch_version, merge_flags, print_plan, run_binary

# A run that only has to get as far as the error (or write one small checkpoint).
TINY = ["--model", "mlp", "--limit-train-batches", "2", "--limit-val-batches", "1", "--limit-test-batches", "1",
        "--num-sanity-val-steps", "0", "--no-progress-bar", "--no-model-summary", "--num-threads", "1"]


def fails(run, code, *phrases, hint=True):
    """Asserts exit `code` and that stderr holds every phrase (and a HINT when `hint`)."""
    assert_clean_exit(run)
    assert run.returncode == code, repr(run)
    for phrase in phrases:
        assert phrase in run.stderr, f"{phrase!r} not on stderr: {run!r}"
    if hint:
        assert "HINT" in run.stderr, f"no HINT on stderr: {run!r}"
    assert "Fit summary" not in run.stdout, repr(run)


# (id, flags, exit code, phrases on stderr, whether a HINT is expected)
CASES = [
    ("data-dir-missing", ["--data-dir", "/nonexistent"], 1,
     ["'/nonexistent'", "does not exist", "apt-get install dataset-fashion-mnist", "--data-dir"], True),
    ("unknown-flag", ["--max-epoch", "3"], 2, ["--max-epoch", "--help"], False),
    ("max-epochs-text", ["--max-epochs", "three"], 2, ["--max-epochs", "three"], False),
    ("limit-above-one", ["--limit-train-batches", "1.5"], 1, ["--limit-train-batches='1.5'", "[0.0, 1.0]"], True),
    ("limit-negative", ["--limit-train-batches", "-1"], 1, ["--limit-train-batches='-1'", "integer >= 0"], True),
    ("limit-text", ["--limit-train-batches", "abc"], 1, ["--limit-train-batches='abc'", "a batch count"], True),
    ("accelerator-gpu", ["--accelerator", "gpu"], 1, ["accelerator='gpu'", "'cpu'"], True),
    # (--devices 2 was refused before DDP; now it launches 2 processes, so it is no bad input.)
    ("devices-text", ["--devices", "two"], 1, ["devices='two'", "\"0,1\""], True),
    ("precision-16-mixed", ["--precision", "16-mixed"], 1,
     ["precision='16-mixed'", "'32-true'", "HINT: use precision='bf16-mixed'"], True),
    ("use-amp-on-cpu", ["--use-amp"], 1, ["use_amp=true became precision='16-mixed'", "precision='bf16-mixed'"], True),
    ("amp-level-unknown", ["--use-amp", "--amp-level", "O7"], 1, ["amp_level='O7'", "'O1'"], True),
    ("precision-unknown", ["--precision", "8-mixed"], 1, ["precision='8-mixed'", "'bf16-mixed' (alias bf16)"], True),
    ("model-resnet", ["--model", "resnet"], 1, ["--model=resnet", "'mlp'", "'cnn'"], True),
    ("num-workers-negative", ["--num-workers", "-2"], 1, ["--num-workers=-2", ">= 0"], True),
    ("lr-negative", ["--lr", "-1"], 1, ["--lr=-1"], True),
    ("hidden-zero", ["--hidden", "0"], 1, ["--hidden=0"], True),
    ("val-size-too-big", ["--val-size", "60000"], 1, ["--val-size=60000"], True),
    ("ckpt-missing", ["--ckpt-path", "/nonexistent.ckpt"], 1, ["/nonexistent.ckpt", "does not exist"], True),
]


# Errors only with a LibTorch that has no float16 autocast on CPU (Debian's 1.13; 2.4 added it).
NEED_NO_CPU_FLOAT16 = {"precision-16-mixed", "use-amp-on-cpu"}


@pytest.mark.parametrize("case,flags,code,phrases,hint", CASES, ids=[c[0] for c in CASES])
def test_bad_flag(binary, dataset, tmp_path, case, flags, code, phrases, hint):
    if case in NEED_NO_CPU_FLOAT16 and libtorch_version(binary) >= (2, 4):
        # This LibTorch runs float16 autocast on CPU: the flags are good input there (checked, not
        # skipped, so that CTest does not report this whole test as skipped).
        plan = print_plan(binary, flags)
        assert plan["precision"].startswith("16-mixed "), plan
        return
    run = run_binary(binary, merge_flags(TINY, flags), tmp_path, timeout=60)
    fails(run, code, *phrases, hint=hint)


def test_data_dir_without_the_files(binary, tmp_path):
    (tmp_path / "data").mkdir()
    run = run_binary(binary, merge_flags(TINY, ["--data-dir", str(tmp_path / "data")]), tmp_path / "root",
                     timeout=60)
    fails(run, 1, str(tmp_path / "data" / "train-images-idx3-ubyte.gz"), "does not exist",
          "apt-get install dataset-fashion-mnist")


@pytest.fixture(scope="module")
def mlp_ckpt(binary, dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("mlp_ckpt")
    run = run_binary(binary, TINY + ["--max-epochs", "1", "--no-test"], root)
    assert_ok(run)
    return run.version_dir(0) / "checkpoints" / "last.ckpt"


def test_truncated_checkpoint(binary, mlp_ckpt, tmp_path):
    data = mlp_ckpt.read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[: len(data) // 2])
    run = run_binary(binary, TINY + ["--ckpt-path", str(cut)], tmp_path, timeout=60)
    fails(run, 1, str(cut), "truncated or corrupt")


def test_garbage_checkpoint(binary, dataset, tmp_path):
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"this is not a checkpoint\n" * 100)
    run = run_binary(binary, TINY + ["--ckpt-path", str(junk)], tmp_path, timeout=60)
    fails(run, 1, str(junk))


def test_empty_checkpoint(binary, dataset, tmp_path):
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    run = run_binary(binary, TINY + ["--ckpt-path", str(empty)], tmp_path, timeout=60)
    fails(run, 1, str(empty), "empty")


def test_checkpoint_directory(binary, dataset, tmp_path):
    run = run_binary(binary, TINY + ["--ckpt-path", str(tmp_path)], tmp_path, timeout=60)
    fails(run, 1, str(tmp_path), "directory")


def test_cnn_checkpoint_into_mlp(binary, dataset, tmp_path):
    cnn = run_binary(binary, merge_flags(TINY, ["--model", "cnn", "--max-epochs", "1", "--no-test"]), tmp_path / "cnn")
    assert_ok(cnn)
    ckpt = cnn.version_dir(0) / "checkpoints" / "last.ckpt"
    run = run_binary(binary, TINY + ["--ckpt-path", str(ckpt)], tmp_path / "mlp", timeout=60)
    fails(run, 1, str(ckpt), "does not fit",
          # MLP parameters the CNN checkpoint lacks (net.3 is a pooling layer there) ...
          "missing: 'net.3.weight'", "missing: 'net.3.bias'",
          # ... CNN parameters and buffers the MLP does not have ...
          "unexpected: 'net.0.weight'", "unexpected: 'net.9.weight'", "unexpected: 'net.11.bias'",
          "unexpected: 'net.1.running_mean'",
          # ... and net.1 and net.5, batch norms there and linear layers here.
          "shape mismatch: 'net.1.weight'", "shape mismatch: 'net.5.bias'")
    # Refused before the run writes anything: no version_0 with only hparams.yaml in it.
    assert not (tmp_path / "mlp" / "lightning_logs").exists(), list((tmp_path / "mlp").rglob("*"))


def test_good_flags_still_work(binary, dataset, tmp_path):
    """The flags the cases above get wrong, given right (so those cases fail for the right reason)."""
    run = run_binary(binary, merge_flags(TINY, ["--max-epochs", "1", "--accelerator", "cpu", "--devices", "1",
                                                "--precision", "32-true", "--limit-train-batches", "0.001"]),
                     tmp_path)
    assert_ok(run)
    assert run.summary()[0]["global step"] == "1"  # floor(860 * 0.001) = 0 -> at least 1 batch


def test_no_validation_still_checkpoints(binary, dataset, tmp_path):
    """--limit-val-batches 0 (like --val-size 0) leaves no val/acc to rank checkpoints by; the run
    must still finish and keep the latest checkpoint instead of failing after the first epoch."""
    run = run_binary(binary, merge_flags(TINY, ["--max-epochs", "2", "--limit-val-batches", "0", "--no-test"]),
                     tmp_path)
    assert_ok(run)
    names = sorted(p.name for p in (run.version_dir(0) / "checkpoints").iterdir())
    assert names == ["epoch=1-step=4.ckpt", "last.ckpt"], names
