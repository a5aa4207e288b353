"""SIGTERM or SIGINT mid-training stops the run promptly and cleanly: exit 130, a summary saying
'interrupted', the logs kept."""
import queue
import signal
import subprocess
import threading
import time

import pytest

from volt_e2e import CRASH_MARKERS, parse_fit_summary


def start_reader(stream, lines):
    def pump():
        for line in stream:
            lines.put(line)
        lines.put(None)
    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.compat), signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_training(binary, dataset, tmp_path, sig):
    # The plain progress output prints a line when each epoch ends; 50 epochs would take minutes.
    args = [binary, "--model", "mlp", "--max-epochs", "50", "--limit-train-batches", "20", "--limit-val-batches", "3",
            "--log-every-n-steps", "1", "--num-threads", "1", "--default-root-dir", str(tmp_path)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        lines = queue.Queue()
        out = []
        reader = start_reader(proc.stdout, lines)
        err = []
        err_reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
        err_reader.start()

        deadline = time.monotonic() + 120
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"exited before training: {''.join(out)}{''.join(err)}"
            out.append(line)
            if line.startswith("Epoch 1:"):  # two epochs done: training is under way
                break
        sent = time.monotonic()
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 20 s after {sig.name}:\n{''.join(out)}")
        stopped_after = time.monotonic() - sent
        reader.join(timeout=10)
        err_reader.join(timeout=10)
        while not lines.empty():
            line = lines.get_nowait()
            if line is not None:
                out.append(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    stdout, stderr = "".join(out), "".join(err)
    assert code == 130, f"exit code {code} after {sig.name}\n{stdout}\n{stderr}"
    assert stopped_after < 20
    for marker in CRASH_MARKERS:
        assert marker not in stderr and marker not in stdout, marker
    fields, _ = parse_fit_summary(stdout)
    assert fields["stop reason"] == "interrupted"
    assert f"received signal {int(sig)}" in fields.get("message", "")
    assert int(fields["epochs completed"]) < 50
    assert "stopped: interrupted" in stdout
    assert "Test metric" not in stdout, "an interrupted run must not go on to test"
    version = tmp_path / "lightning_logs" / "version_0"
    assert (version / "metrics.csv").is_file()
    assert (version / "hparams.yaml").is_file()
    assert (version / "checkpoints" / "last.ckpt").is_file()
