"""Reads what an MLflow tracking server holds, with MLflow's own Python client, and prints it as JSON.

Runs in a process of its own, with scripts/setup.sh's MLflow folder on PYTHONPATH, so MLflow's
dependencies never meet the Debian packages the test itself imports (torch, numpy).

    python3 mlflow_read.py TRACKING_URI EXPERIMENT [DOWNLOAD_DIR]
"""
import json
import sys

from mlflow.tracking import MlflowClient


def artifacts(client, run_id, path=None):
    out = []
    for item in client.list_artifacts(run_id, path):
        out.extend(artifacts(client, run_id, item.path) if item.is_dir else [item.path])
    return out


def main():
    uri, experiment_name = sys.argv[1], sys.argv[2]
    download = sys.argv[3] if len(sys.argv) > 3 else None
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = []
    if experiment is not None:
        for run in client.search_runs([experiment.experiment_id]):
            histories = {key: [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, key)]
                         for key in run.data.metrics}
            files = artifacts(client, run.info.run_id)
            if download:
                client.download_artifacts(run.info.run_id, "", download)
            runs.append({"run_id": run.info.run_id, "run_name": run.info.run_name, "status": run.info.status,
                         "start_time": run.info.start_time, "end_time": run.info.end_time,
                         "params": run.data.params, "tags": run.data.tags, "metrics": histories,
                         "artifacts": sorted(files)})
    json.dump({"experiment": experiment.experiment_id if experiment else None, "runs": runs}, sys.stdout,
              allow_nan=True)


if __name__ == "__main__":
    main()
