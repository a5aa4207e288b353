"""Config files like LightningCLI's: --config run.yaml with flags on top, --print-config, and the
resolved config saved beside the logs and inside the checkpoints."""
import yaml

from volt_e2e import assert_clean_exit, assert_ok, load_checkpoint, run_binary

# Flags that keep a run to a few seconds; the config file sets the rest.
QUICK = ["--limit-val-batches", "2", "--limit-test-batches", "2", "--num-sanity-val-steps", "0",
         "--no-progress-bar", "--no-model-summary", "--num-threads", "1"]

RUN_YAML = """\
trainer:
  max_epochs: 3
  limit_train_batches: 20
  seed: 11
  log_every_n_steps: 5
model:
  model: mlp
  hidden: 64
  lr: 0.002
data:
  batch_size: 32
save_top_k: 2
"""


def print_config(binary, args):
    run = run_binary(binary, list(args) + ["--print-config"], timeout=60)
    assert_ok(run)
    assert run.stderr == "", repr(run)
    return run.stdout


def test_file_values_with_flags_on_top(binary, dataset, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(RUN_YAML)
    root = tmp_path / "root"
    run = run_binary(binary, ["--config", str(config), "--max-epochs", "1", "--limit-train-batches", "5"] + QUICK,
                     root, timeout=120)
    assert_ok(run)
    fields, _ = run.summary()
    assert fields["epochs completed"] == "1", fields   # the flag, not the file's 3
    assert fields["global step"] == "5", fields        # the flag's 5 batches, not the file's 20

    # config.yaml beside the logs: the resolved config, flags, file and defaults together.
    saved = yaml.safe_load((run.version_dir(0) / "config.yaml").read_text())
    assert saved["trainer"]["max_epochs"] == 1
    assert saved["trainer"]["limit_train_batches"] == 5
    assert saved["trainer"]["seed"] == 11
    assert saved["trainer"]["default_root_dir"] == str(root)
    assert saved["trainer"]["accumulate_grad_batches"] == 1          # a default
    assert saved["model"] == {"model": "mlp", "hidden": 64, "lr": 0.002, "lr_gamma": 0.5}
    assert saved["data"]["batch_size"] == 32
    assert saved["save_top_k"] == 2

    # The checkpoint's hyper_parameters carry the same config next to the module's own.
    checkpoint = load_checkpoint(run.version_dir(0) / "checkpoints" / "last.ckpt")
    hparams = checkpoint["hyper_parameters"]
    assert hparams["config"] == saved
    assert hparams["hidden"] == 64


def test_print_config_fed_back_reproduces_the_config(binary, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(RUN_YAML)
    printed = print_config(binary, ["--config", str(config), "--max-epochs", "2", "--no-logger"])
    resolved = yaml.safe_load(printed)
    assert resolved["trainer"]["max_epochs"] == 2
    assert resolved["trainer"]["logger"] is False
    assert resolved["trainer"]["limit_train_batches"] == 20
    assert resolved["model"]["hidden"] == 64
    assert resolved["trainer"]["gradient_clip_val"] is None   # unset stays unset
    assert "print_plan" not in resolved and "config" not in resolved

    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    assert print_config(binary, ["--config", str(again)]) == printed


def test_print_config_shows_the_defaults(binary):
    resolved = yaml.safe_load(print_config(binary, []))
    assert set(resolved) >= {"trainer", "model", "data", "save_top_k", "early_stopping_patience", "no_test"}
    assert resolved["trainer"]["max_epochs"] == 3   # the example's own default
    assert resolved["trainer"]["limit_train_batches"] == 1.0
    assert resolved["model"]["model"] == "cnn"
    assert resolved["data"]["data_dir"] == "/usr/share/datasets/fashion-mnist"


def bad_config(binary, tmp_path, text):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    run = run_binary(binary, ["--config", str(config)] + QUICK, tmp_path / "root", timeout=60)
    assert_clean_exit(run)
    assert run.returncode == 1, repr(run)
    assert "Fit summary" not in run.stdout, repr(run)
    assert str(config) in run.stderr and "HINT" in run.stderr, repr(run)
    return run.stderr


def test_unknown_key_names_the_key_and_the_accepted_ones(binary, tmp_path):
    err = bad_config(binary, tmp_path, "trainer:\n  max_epoch: 3\n")
    assert "unknown key 'trainer.max_epoch'" in err
    assert "did you mean 'trainer.max_epochs'" in err
    assert "limit_train_batches" in err


def test_unknown_section_lists_the_sections(binary, tmp_path):
    err = bad_config(binary, tmp_path, "optimizer:\n  lr: 0.1\n")
    assert "unknown section 'optimizer:'" in err
    assert "Sections: data, model, trainer" in err


def test_key_in_the_wrong_section(binary, tmp_path):
    err = bad_config(binary, tmp_path, "trainer:\n  lr: 0.1\n")
    assert "'lr' is a 'model:' key, but it is under 'trainer:'" in err


def test_wrong_type_names_the_key(binary, tmp_path):
    err = bad_config(binary, tmp_path, "trainer:\n  max_epochs: three\n")
    assert "trainer.max_epochs='three' is not an integer" in err
    err = bad_config(binary, tmp_path, "trainer:\n  limit_train_batches: 1.5\n")
    assert "trainer.limit_train_batches='1.5'" in err and "[0.0, 1.0]" in err
    err = bad_config(binary, tmp_path, "model:\n  lr: fast\n")
    assert "model.lr='fast' is not a number" in err


def test_invalid_yaml(binary, tmp_path):
    err = bad_config(binary, tmp_path, "trainer:\n  max_epochs: [3\n")
    assert "is not valid YAML" in err


def test_missing_config_file(binary, tmp_path):
    run = run_binary(binary, ["--config", str(tmp_path / "nope.yaml")], timeout=60)
    assert_clean_exit(run)
    assert run.returncode == 2, repr(run)
    assert "nope.yaml" in run.stderr, repr(run)
