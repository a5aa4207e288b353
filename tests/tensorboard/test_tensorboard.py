"""TensorBoard reads Volt's event files: every scalar, the hyperparameters, the session's end.

Run by CTest (test `tensorboard_reads_event_files_py`), which sets TB_WRITER to the C++ program
`tb_writer` and PYTHONPATH to the folder where scripts/setup.sh installs the `tensorboard`
package. tb_writer logs a small run through TensorBoardLogger and CSVLogger (sharing one version
folder, as the Trainer will) and prints as JSON what it logged; each test compares that with
what the real tensorboard reads.
"""

import collections
import json
import os
import re
import shutil
import socket
import subprocess

import numpy as np
import pytest

try:
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2
    from tensorboard.plugins.hparams import backend_context
    from tensorboard.plugins.hparams import list_session_groups
    from tensorboard.plugins.hparams import metadata as hparams_metadata
except ImportError as e:  # a clear failure, not a skip: CI must run this test
    raise ImportError(
        f"cannot import tensorboard ({e}) with PYTHONPATH={os.environ.get('PYTHONPATH')!r}. "
        "HINT: run scripts/setup.sh, which installs it there."
    ) from e

TB_WRITER = os.environ.get("TB_WRITER")
ALL_STATUSES = [api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE,
                api_pb2.STATUS_RUNNING]


def run_writer(save_dir, *args):
    assert TB_WRITER, "TB_WRITER is not set; run this test through ctest"
    done = subprocess.run([TB_WRITER, str(save_dir), *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run: CSVLogger and TensorBoardLogger in lightning_logs/version_0, status success."""
    return run_writer(tmp_path_factory.mktemp("tb"))


def accumulator(path):
    ea = event_accumulator.EventAccumulator(
        path, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    ea.Reload()
    return ea


def read_raw_records(path):
    """Every record of `path` through TensorBoard's own reader, which checks both CRCs."""
    reader = pywrap_tensorflow.PyRecordReader_New(path, 0, "", None)
    records = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return records
        records.append(reader.record())


def session_groups(logdir):
    """What TensorBoard's HPARAMS dashboard asks the hparams plugin for."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    tb_context = base_plugin.TBContext(
        logdir=logdir, multiplexer=multiplexer,
        data_provider=data_provider.MultiplexerDataProvider(multiplexer, logdir))
    request = api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=100,
                                               allowed_statuses=ALL_STATUSES)
    return list_session_groups.Handler(context.RequestContext(),
                                       backend_context.Context(tb_context), "", request).run()


def test_every_scalar_reads_back_with_its_tag_step_and_value(run):
    expected = collections.defaultdict(list)
    for scalar in run["scalars"]:
        expected[scalar["tag"]].append((scalar["step"], float(np.float32(scalar["value"]))))

    ea = accumulator(run["log_dir"])
    assert sorted(ea.Tags()["scalars"]) == sorted(expected)
    for tag, points in expected.items():
        assert [(e.step, e.value) for e in ea.Scalars(tag)] == points, tag
    assert sum(len(p) for p in expected.values()) == 1 + 12 * 2 + 3 * 5


def test_the_event_file_is_named_as_tensorboard_names_them_beside_the_csv_files(run):
    name = os.path.basename(run["event_file"])
    pattern = (r"events\.out\.tfevents\.\d{10}\." + re.escape(socket.gethostname()) +
               r"\." + str(run["pid"]) + r"\.\d+")
    assert re.fullmatch(pattern, name), name
    assert run["log_dir"].endswith(os.path.join("lightning_logs", "version_0"))
    assert sorted(os.listdir(run["log_dir"])) == sorted([name, "hparams.yaml", "metrics.csv"])


def test_every_record_passes_tensorboards_crc_checks_and_the_first_is_the_file_version(run):
    records = read_raw_records(run["event_file"])
    first = event_pb2.Event.FromString(records[0])
    assert first.file_version == "brain.Event:2"
    assert first.wall_time > 1.6e9
    # tb_writer's run: the file version, experiment, session start, hp_metric, 12 training steps,
    # 3 validations, the session end.
    assert len(records) == 1 + 2 + 1 + 12 + 3 + 1


def test_a_corrupted_record_is_refused_by_tensorboards_reader(run, tmp_path):
    """The CRC check above is live: the same reader rejects a file with one flipped byte."""
    corrupted = tmp_path / "events.out.tfevents.corrupted"
    shutil.copy(run["event_file"], corrupted)
    data = bytearray(corrupted.read_bytes())
    data[20] ^= 0x01  # inside the first record's data
    corrupted.write_bytes(bytes(data))
    with pytest.raises(errors.DataLossError):
        read_raw_records(str(corrupted))


def test_the_hparams_plugin_data_holds_the_logged_hyperparameters(run):
    content = accumulator(run["log_dir"]).PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    assert sorted(content) == ["_hparams_/experiment", "_hparams_/session_end_info",
                               "_hparams_/session_start_info"]

    start = hparams_metadata.parse_session_start_info_plugin_data(
        content["_hparams_/session_start_info"])
    values = {key: getattr(value, value.WhichOneof("kind")) for key, value in start.hparams.items()}
    assert values == run["hparams"]

    experiment = hparams_metadata.parse_experiment_plugin_data(content["_hparams_/experiment"])
    types = {info.name: api_pb2.DataType.Name(info.type) for info in experiment.hparam_infos}
    assert types == {"lr": "DATA_TYPE_FLOAT64", "batch_size": "DATA_TYPE_FLOAT64",
                     "model": "DATA_TYPE_STRING", "deterministic": "DATA_TYPE_BOOL",
                     "optimizer/name": "DATA_TYPE_STRING", "optimizer/betas": "DATA_TYPE_STRING",
                     "seed": "DATA_TYPE_STRING"}
    assert [m.name.tag for m in experiment.metric_infos] == ["hp_metric"]

    end = hparams_metadata.parse_session_end_info_plugin_data(
        content["_hparams_/session_end_info"])
    assert end.status == api_pb2.STATUS_SUCCESS
    assert end.end_time_secs >= start.start_time_secs > 1.6e9


@pytest.mark.parametrize("status, expected", [("success", api_pb2.STATUS_SUCCESS),
                                              ("failed", api_pb2.STATUS_FAILURE),
                                              ("interrupted", api_pb2.STATUS_UNKNOWN)])
def test_the_hparams_dashboard_lists_the_run_with_its_values_metric_and_status(
        tmp_path, status, expected):
    run = run_writer(tmp_path, "--status", status)
    response = session_groups(str(tmp_path / "lightning_logs"))
    assert response.total_size == 1
    (group,) = response.session_groups
    values = {key: getattr(value, value.WhichOneof("kind")) for key, value in group.hparams.items()}
    assert values == run["hparams"]
    (session,) = group.sessions
    assert session.name == "version_0"
    assert session.status == expected
    assert [(m.name.tag, m.value) for m in session.metric_values] == [("hp_metric", -1.0)]


def test_a_slurm_job_id_is_used_verbatim_as_the_version(tmp_path):
    run = run_writer(tmp_path, "--version", "12345_3")
    assert run["log_dir"] == str(tmp_path / "lightning_logs" / "12345_3")
    assert os.path.isfile(os.path.join(run["log_dir"], "metrics.csv"))
    assert accumulator(run["log_dir"]).Scalars("epoch")[-1].value == 2.0


def test_consecutive_runs_take_consecutive_versions_one_event_file_each(tmp_path):
    first = run_writer(tmp_path)
    second = run_writer(tmp_path, "--no-csv")
    assert os.path.basename(first["log_dir"]) == "version_0"
    assert os.path.basename(second["log_dir"]) == "version_1"
    for run in (first, second):
        files = [f for f in os.listdir(run["log_dir"]) if f.startswith("events.out.tfevents.")]
        assert files == [os.path.basename(run["event_file"])]
