"""MLFlowLogger against a real `mlflow server` (PyPI's, installed by scripts/setup.sh), read back with
MLflow's own Python client: metrics equal metrics.csv value for value, params, tags, the run's status,
the config and checkpoints as artifacts; a server that comes up late still gets everything."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from volt_e2e import DETERMINISTIC, SHORT, assert_ok, cluster_free_env, read_metrics_csv, run_binary
from volt_testkit import free_port, require

MLFLOW_PYTHONPATH = os.environ.get("VOLT_MLFLOW_PYTHONPATH", "/opt/volt/python-mlflow")
READER = Path(__file__).with_name("mlflow_read.py")
RUN_FLAGS = ["--model", "mlp", "--max-epochs", "2", "--log-every-n-steps", "5", "--no-test"] + SHORT + DETERMINISTIC


def mlflow_env():
    env = cluster_free_env(PYTHONPATH=MLFLOW_PYTHONPATH, PYTHONDONTWRITEBYTECODE="1")
    for name in [k for k in env if k.startswith("MLFLOW_")]:
        del env[name]
    return env


class Server:
    """`mlflow server` on 127.0.0.1:port, runs in SQLite, artifacts served (MLflow's default)."""

    def __init__(self, root, port):
        self.root, self.port = Path(root), port
        self.uri = f"http://127.0.0.1:{port}"
        self.log = open(self.root / f"server-{port}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db", "--artifacts-destination",
             str(self.root / "artifacts")],
            # No job runner: these tests run no MLflow jobs, and its store (a folder in /dev/shm) outlived
            # the server, which is killed at once.
            cwd=self.root, env=dict(mlflow_env(), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"), stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def wait_up(self, seconds=90):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {self.proc.returncode}:\n"
                            f"{(self.root / f'server-{self.port}.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=1) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"mlflow server did not answer on {self.uri} within {seconds} s")

    def stop(self):
        # Killed at once: nothing reads the server after the tests, and a graceful stop waited out
        # its 20 s here (the late test's forwarded connections keep the server's workers busy).
        os.killpg(self.proc.pid, 9)
        self.proc.wait()
        self.log.close()

    def read(self, experiment, download=None):
        args = [sys.executable, str(READER), self.uri, experiment] + ([str(download)] if download else [])
        out = subprocess.run(args, capture_output=True, text=True, env=mlflow_env(), timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


@pytest.fixture(scope="module")
def mlflow_installed():
    probe = subprocess.run([sys.executable, "-c", "import mlflow.server"], env=mlflow_env(), capture_output=True)
    require(probe.returncode == 0, f"MLflow is not installed in {MLFLOW_PYTHONPATH} (scripts/setup.sh installs it): "
                                   f"{probe.stderr.decode()[-300:]}")


@pytest.fixture(scope="module")
def starting_server(mlflow_installed, tmp_path_factory):
    """The module's server, started and not waited for: the first test (the one that needs it only
    after a run that waits out its 30 s for a server that never answers) runs while it comes up."""
    started = Server(tmp_path_factory.mktemp("mlflow"), free_port())
    yield started
    started.stop()


@pytest.fixture
def server(starting_server):
    return starting_server.wait_up()


def assert_metrics_match_csv(run, version_dir):
    """Every value of metrics.csv is in MLflow at its step, and MLflow has nothing else. Compared as
    sets: MLflow stores a value logged twice at the same step and millisecond once (its key), as
    happens to `epoch`, which the step, validation and epoch-end rows of one step all carry."""
    columns, rows = read_metrics_csv(version_dir / "metrics.csv")
    expected = {}
    for row in rows:
        for name in columns:
            if name != "step" and row[name] != "":
                expected.setdefault(name, []).append([int(row["step"]), float(row[name])])
    got = {name: {tuple(point) for point in history} for name, history in run["metrics"].items()}
    assert got == {name: {tuple(point) for point in history} for name, history in expected.items()}


def docs_send_undelivered(tmp_path):
    """The ```python block of docs/loggers.md that sends an undelivered file, as a script."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "loggers.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "send_undelivered.py"
    script.write_text(block)
    return script


# First in the file: its run's 30 s wait overlaps the server's start-up (starting_server).
def test_a_server_that_never_answers_costs_a_bounded_wait_and_loses_nothing(starting_server, binary, dataset,
                                                                           tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run = run_binary(binary, RUN_FLAGS + ["--mlflow-tracking-uri", uri], tmp_path, env=cluster_free_env())
    assert_ok(run)
    version_dir = run.version_dir(0)
    undelivered = version_dir / "mlflow-undelivered.jsonl"
    assert f"{uri} did not take" in run.stderr and str(undelivered) in run.stderr, run.stderr
    lines = [json.loads(line) for line in undelivered.read_text().splitlines()]
    metrics = {}
    for line in lines:
        if line["type"] == "metric":
            metrics.setdefault(line["key"], []).append([line["step"], line["value"]])
    assert_metrics_match_csv({"metrics": metrics}, version_dir)
    assert {"type": "param", "key": "model", "value": "mlp"} in lines
    assert [line["status"] for line in lines if line["type"] == "status"] == ["FINISHED"]
    assert run.seconds < 120, run
    # docs/loggers.md's way of sending the file once a server answers: MLflow then holds it all.
    server = starting_server.wait_up()
    sent = subprocess.run([sys.executable, str(docs_send_undelivered(tmp_path)), str(version_dir), server.uri],
                          capture_output=True, text=True, env=mlflow_env(), timeout=120)
    assert sent.returncode == 0, sent.stderr
    found = server.read("lightning_logs")
    assert len(found["runs"]) == 1, found
    assert found["runs"][0]["status"] == "FINISHED"
    assert found["runs"][0]["params"]["model"] == "mlp"
    assert_metrics_match_csv(found["runs"][0], version_dir)


def test_a_fit_is_one_mlflow_run_with_every_metric_param_and_checkpoint(server, binary, dataset, tmp_path):
    run = run_binary(binary, RUN_FLAGS + ["--mlflow-tracking-uri", server.uri, "--mlflow-experiment-name", "fit",
                                          "--mlflow-log-model", "end"], tmp_path, env=cluster_free_env())
    assert_ok(run)
    assert "MLFlowLogger" not in run.stderr, run.stderr
    found = server.read("fit", download=tmp_path / "downloaded")
    assert len(found["runs"]) == 1, found
    mlflow_run = found["runs"][0]
    version_dir = run.version_dir(0)
    assert mlflow_run["status"] == "FINISHED"
    assert mlflow_run["run_name"] == "version_0"
    assert mlflow_run["end_time"] >= mlflow_run["start_time"]
    assert mlflow_run["tags"]["volt.log_dir"] == str(version_dir.resolve())
    assert mlflow_run["params"]["model"] == "mlp"
    assert float(mlflow_run["params"]["lr"]) == pytest.approx(1e-3)
    assert_metrics_match_csv(mlflow_run, version_dir)
    assert len(mlflow_run["metrics"]["train/loss_step"]) == 8  # every 5th of 40 steps
    # The config and the checkpoints ModelCheckpoint kept (last + best), byte for byte.
    kept = sorted(p.name for p in (version_dir / "checkpoints").iterdir())
    assert mlflow_run["artifacts"] == sorted(["config.yaml"] + [f"checkpoints/{name}" for name in kept])
    for name in kept:
        assert (tmp_path / "downloaded" / "checkpoints" / name).read_bytes() == \
            (version_dir / "checkpoints" / name).read_bytes()
    assert (tmp_path / "downloaded" / "config.yaml").read_bytes() == (version_dir / "config.yaml").read_bytes()
    run_file = json.loads((version_dir / "mlflow-run.json").read_text())
    assert run_file["run_id"] == mlflow_run["run_id"]


def test_a_sharded_checkpoint_is_uploaded_with_its_shards(server, binary, dataset, tmp_path):
    """fsdp's sharded checkpoints, written in the background: MLflow keeps each file ModelCheckpoint
    kept with the shards beside it (the index alone is no model), byte for byte."""
    run = run_binary(binary, RUN_FLAGS + ["--devices", "2", "--strategy", "fsdp", "--state-dict-type", "sharded",
                                          "--async-checkpointing", "--mlflow-tracking-uri", server.uri,
                                          "--mlflow-experiment-name", "sharded", "--mlflow-log-model", "end"],
                     tmp_path, env=cluster_free_env())
    assert_ok(run)
    found = server.read("sharded", download=tmp_path / "downloaded")
    assert len(found["runs"]) == 1, found
    checkpoints = run.version_dir(0) / "checkpoints"
    kept = sorted(p.name for p in checkpoints.iterdir())
    assert len([name for name in kept if ".shard" in name]) == 2 * len([n for n in kept if n.endswith(".ckpt")]), kept
    assert found["runs"][0]["artifacts"] == sorted(["config.yaml"] + [f"checkpoints/{name}" for name in kept])
    for name in kept:
        assert (tmp_path / "downloaded" / "checkpoints" / name).read_bytes() == (checkpoints / name).read_bytes()


class LatePort:
    """127.0.0.1:port, where nothing listens until open(); from then on every connection is forwarded
    to 127.0.0.1:target. To a client, a server that came up late, but at a moment the test chooses
    and in no time (a real `mlflow server` takes 10 to 25 s to start, which raced the run's retries
    and the 30 s that its end waits for the server)."""

    def __init__(self, port, target):
        self.port, self.target = port, target
        self.listener = None

    def open(self):
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    @staticmethod
    def pump(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        if self.listener is not None:
            self.listener.close()


def test_a_server_that_comes_up_late_still_gets_everything(server, binary, dataset, tmp_path):
    # The run starts with nothing listening at its URI; once it said that a send failed, the port
    # opens (onto the server already running), as when the server comes up while the run trains or
    # while fit's end waits for it: the buffered values are sent then.
    late = LatePort(free_port(), server.port)
    uri = f"http://127.0.0.1:{late.port}"
    with open(tmp_path / "stdout.txt", "w") as stdout_file:
        proc = subprocess.Popen([binary] + RUN_FLAGS + ["--mlflow-tracking-uri", uri, "--mlflow-experiment-name",
                                                        "late", "--default-root-dir", str(tmp_path)],
                                cwd=tmp_path, env=cluster_free_env(), stdout=stdout_file, stderr=subprocess.PIPE,
                                text=True)
    stderr_lines = []
    failed_send = threading.Event()

    def read_stderr():
        for line in proc.stderr:
            stderr_lines.append(line)
            if "keeping the metrics and trying again" in line:
                failed_send.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not failed_send.wait(0.1) and proc.poll() is None and time.monotonic() < deadline:
            pass
        assert failed_send.is_set(), f"no failed send reported (exit {proc.poll()}):\n{''.join(stderr_lines)}"
        late.open()
        proc.wait(timeout=240)
        reader.join(timeout=60)
        stderr = "".join(stderr_lines)
        assert proc.returncode == 0, stderr
        assert f"{uri} answers again after" in stderr, stderr
        assert "did not take" not in stderr, stderr
        found = server.read("late")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        late.close()
    assert len(found["runs"]) == 1, found
    version_dir = tmp_path / "lightning_logs" / "version_0"
    assert found["runs"][0]["status"] == "FINISHED"
    assert_metrics_match_csv(found["runs"][0], version_dir)
    assert not (version_dir / "mlflow-undelivered.jsonl").exists()


def test_a_bad_tracking_uri_is_refused_before_training(binary, tmp_path):
    run = run_binary(binary, ["--mlflow-tracking-uri", "file:./mlruns"], tmp_path, env=cluster_free_env())
    assert run.returncode != 0
    assert "file:./mlruns" in run.stderr and "HINT:" in run.stderr, run.stderr
    assert not (tmp_path / "lightning_logs").exists()
