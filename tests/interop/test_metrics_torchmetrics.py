"""Volt's metrics equal torchmetrics' (1.3.2) on the same inputs.

Run by CTest (test `metrics_torchmetrics_py`), which sets METRICS_INTEROP_TOOL to the path of the
C++ `metrics_interop_tool`. Needs /usr/bin/python3 with torch (Debian's python3-torch) and
torchmetrics 1.3.2, which scripts/setup.sh installs into a folder of its own
(VOLT_LIGHTNING2_PYTHONPATH, /opt/volt/python-lightning2); this module puts it on sys.path.

Every case is seeded random inputs, split into uneven batches that both sides update() with in
turn before compute(), so accumulation is compared too. All cases go to the tool in one launch
(loading libtorch costs more than all the metrics), and each case is one test.

Compared: MulticlassAccuracy, MulticlassPrecision, MulticlassRecall and MulticlassF1Score with
average micro and macro, on probabilities, logits (float32 and float64) and class indices, with
top_k 1, 2 and 3, and on inputs where some classes are predicted but never expected, expected but
never predicted, or neither (macro leaves some of them out); MulticlassConfusionMatrix (not
normalized); BinaryAUROC and MulticlassAUROC (macro, exact) on probabilities, logits, tied scores
and classes without positives; MeanSquaredError on float32, float64 and integer targets.

Not compared, because Volt has no such option: binary and multilabel accuracy/precision/recall/F1,
average "weighted" and "none", ignore_index, thresholds (binned curves), the confusion matrix's
normalize, and AUROC's max_fpr and other averages.
"""

import json
import math
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from volt_testkit import import_from

TOOL = os.environ.get("METRICS_INTEROP_TOOL")
# Where scripts/setup.sh installs torchmetrics 1.3.2 (beside Lightning 2.2.5, which needs it); it
# holds no torch of its own, so Debian's python3-torch is still the one imported.
TORCHMETRICS_PATH = Path(os.environ.get("VOLT_LIGHTNING2_PYTHONPATH", "/opt/volt/python-lightning2"))
torchmetrics, tmc = import_from(TORCHMETRICS_PATH, "torchmetrics", "torchmetrics.classification")

# torchmetrics computes its ratios in float32 (_safe_divide casts the counts with .float()), and
# its ROC curve and MSE states are float32 too; Volt computes in double. 1e-6 is float32's
# rounding with room for the sums over a few hundred examples.
REL_TOL = 1e-6
ABS_TOL = 1e-12  # for values that are 0 on one side and float32's 0 on the other

EXAMPLES = 97
BATCHES = (40, 7, 50)  # uneven, so accumulation across update() calls is exercised


def split(tensor):
    return list(torch.split(tensor, BATCHES))


def generator(seed):
    return torch.Generator().manual_seed(seed)


# Inputs of the multiclass metrics: kind -> (num_classes, preds, target), each from its own seed.
def classification_inputs(kind, seed):
    g = generator(seed)
    classes = 5
    target = torch.randint(0, classes, (EXAMPLES,), generator=g)
    if kind == "probs":
        return classes, torch.randn(EXAMPLES, classes, generator=g).softmax(1), target
    if kind == "logits":
        return classes, 2 * torch.randn(EXAMPLES, classes, generator=g), target
    if kind == "logits64":
        return classes, 2 * torch.randn(EXAMPLES, classes, generator=g, dtype=torch.float64), target
    if kind == "labels":
        return classes, torch.randint(0, classes, (EXAMPLES,), generator=g), target
    if kind == "sparse":
        # 7 classes: 4 is predicted but never expected, 5 expected but never predicted (its
        # logit is far below the others, even for top_k 3), 6 neither; macro treats each its way.
        classes = 7
        target = torch.tensor([0, 1, 2, 3, 5])[torch.randint(0, 5, (EXAMPLES,), generator=g)]
        logits = 2 * torch.randn(EXAMPLES, classes, generator=g)
        logits[:, 5] -= 20
        logits[:, 6] -= 40
        return classes, logits, target
    raise ValueError(kind)


# (kind, top_k) of the accuracy/precision/recall/F1 cases; class indices allow top_k 1 only.
STAT_INPUTS = [("probs", 1), ("probs", 2), ("logits", 1), ("logits", 3), ("logits64", 1), ("labels", 1),
               ("sparse", 1), ("sparse", 2), ("sparse", 3)]
STAT_METRICS = ["MulticlassAccuracy", "MulticlassPrecision", "MulticlassRecall", "MulticlassF1Score"]


def binary_auroc_inputs(kind, seed):
    g = generator(seed)
    target = torch.randint(0, 2, (EXAMPLES,), generator=g)
    if kind == "probs":
        return torch.rand(EXAMPLES, generator=g), target
    if kind == "logits":
        # torchmetrics turns a batch outside [0, 1] into probabilities with a float32 sigmoid; Volt
        # ranks the scores as given (the sigmoid keeps their order, so the AUROC is the same). Only
        # logits so large that the sigmoid rounds distinct ones to the same float (|x| > ~16)
        # would tie on torchmetrics' side alone: deliberately not imitated, Volt's is exact.
        return 3 * torch.randn(EXAMPLES, generator=g), target
    if kind == "logits64":
        return 3 * torch.randn(EXAMPLES, generator=g, dtype=torch.float64), target
    if kind == "ties":
        return torch.randint(0, 11, (EXAMPLES,), generator=g).float() / 10, target
    if kind == "one_class":
        return torch.rand(EXAMPLES, generator=g), torch.ones(EXAMPLES, dtype=torch.long)
    raise ValueError(kind)


def multiclass_auroc_inputs(kind, seed):
    if kind == "ties":  # scores in [0, 1] on a grid of 7 values, not normalized per example
        g = generator(seed)
        return 4, torch.randint(0, 7, (EXAMPLES, 4), generator=g).float() / 6, torch.randint(0, 4, (EXAMPLES,),
                                                                                              generator=g)
    return classification_inputs(kind, seed)


def regression_inputs(kind, seed):
    g = generator(seed)
    if kind == "float32":
        return torch.randn(EXAMPLES, generator=g), torch.randn(EXAMPLES, generator=g)
    if kind == "float64_2d":
        return (torch.randn(EXAMPLES, 3, generator=g, dtype=torch.float64),
                torch.randn(EXAMPLES, 3, generator=g, dtype=torch.float64))
    if kind == "int_target":
        return 4 * torch.randn(EXAMPLES, generator=g), torch.randint(-5, 6, (EXAMPLES,), generator=g)
    raise ValueError(kind)


def build_cases():
    """name -> {"metric", "options", "preds", "target"}, the same every run."""
    cases = {}

    def add(name, metric, options, preds, target):
        cases[name] = {"metric": metric, "options": options, "preds": preds, "target": target}

    for seed, (kind, top_k) in enumerate(STAT_INPUTS):
        classes, preds, target = classification_inputs(kind, 100 + seed)
        for metric in STAT_METRICS:
            for average in ("micro", "macro"):
                add(f"{metric}-{kind}-top{top_k}-{average}", metric,
                    {"num_classes": classes, "top_k": top_k, "average": average}, preds, target)
    for seed, kind in enumerate(["probs", "logits", "labels", "sparse"]):
        classes, preds, target = classification_inputs(kind, 200 + seed)
        add(f"MulticlassConfusionMatrix-{kind}", "MulticlassConfusionMatrix", {"num_classes": classes}, preds,
            target)
    for seed, kind in enumerate(["probs", "logits", "logits64", "ties", "one_class"]):
        preds, target = binary_auroc_inputs(kind, 300 + seed)
        add(f"BinaryAUROC-{kind}", "BinaryAUROC", {}, preds, target)
    for seed, kind in enumerate(["probs", "logits", "logits64", "ties", "sparse"]):
        classes, preds, target = multiclass_auroc_inputs(kind, 400 + seed)
        add(f"MulticlassAUROC-{kind}", "MulticlassAUROC", {"num_classes": classes}, preds, target)
    for seed, kind in enumerate(["float32", "float64_2d", "int_target"]):
        preds, target = regression_inputs(kind, 500 + seed)
        add(f"MeanSquaredError-{kind}", "MeanSquaredError", {}, preds, target)
    return cases


CASES = build_cases()

DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64", torch.bool: "bool"}


def tensor_json(tensor):
    # float32 and small integers are exact as JSON's doubles, so the tool sees the same values.
    return {"dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape), "values": tensor.flatten().tolist()}


@pytest.fixture(scope="module")
def volt_values(tmp_path_factory):
    """Every case's value from Volt, in one launch of the tool: name -> tensor (float64)."""
    assert TOOL, ("METRICS_INTEROP_TOOL is not set: run this through ctest (ctest -R metrics_torchmetrics_py) "
                  "or set it to the built metrics_interop_tool")
    cases = [{"name": name, "metric": case["metric"], "options": case["options"],
              "batches": [{"preds": tensor_json(p), "target": tensor_json(t)}
                          for p, t in zip(split(case["preds"]), split(case["target"]))]}
             for name, case in CASES.items()]
    path = tmp_path_factory.mktemp("metrics") / "cases.json"
    path.write_text(json.dumps({"cases": cases}))
    run = subprocess.run([TOOL, str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"metrics_interop_tool failed ({run.returncode}):\n{run.stderr[-6000:]}"
    results = json.loads(run.stdout)
    values = {}
    for name, result in results.items():
        values[name] = result if "error" in result else torch.tensor(result["values"],
                                                                     dtype=torch.float64).view(result["shape"])
    return values


def torchmetrics_metric(metric, options):
    """torchmetrics' counterpart of Volt's `metric` with `options`, every argument spelled out."""
    if metric in STAT_METRICS:
        return getattr(tmc, metric)(num_classes=options["num_classes"], top_k=options["top_k"],
                                    average=options["average"])
    if metric == "MulticlassConfusionMatrix":
        return tmc.MulticlassConfusionMatrix(num_classes=options["num_classes"], normalize=None)
    if metric == "BinaryAUROC":
        return tmc.BinaryAUROC(thresholds=None)  # exact, as Volt's
    if metric == "MulticlassAUROC":
        return tmc.MulticlassAUROC(num_classes=options["num_classes"], average="macro", thresholds=None)
    if metric == "MeanSquaredError":
        return torchmetrics.MeanSquaredError()
    raise ValueError(metric)


def torchmetrics_value(case):
    metric = torchmetrics_metric(case["metric"], case["options"])
    with warnings.catch_warnings():
        # "No positive samples in targets, true positive value should be meaningless..." for the
        # cases that test exactly that.
        warnings.simplefilter("ignore", UserWarning)
        for preds, target in zip(split(case["preds"]), split(case["target"])):
            metric.update(preds, target)
        return metric.compute().to(torch.float64)


@pytest.mark.parametrize("name", list(CASES))
def test_volt_equals_torchmetrics(name, volt_values):
    case = CASES[name]
    ours = volt_values[name]
    assert not isinstance(ours, dict), f"Volt rejected {name}: {ours['error']}"
    theirs = torchmetrics_value(case)
    assert ours.shape == theirs.shape, f"{name}: Volt's shape {list(ours.shape)}, torchmetrics' {list(theirs.shape)}"
    if case["metric"] == "MulticlassConfusionMatrix":  # counts: nothing to round
        assert torch.equal(ours, theirs), f"{name}: Volt\n{ours}\n!= torchmetrics\n{theirs}"
        return
    for v, t in zip(ours.flatten().tolist(), theirs.flatten().tolist()):
        assert math.isclose(v, t, rel_tol=REL_TOL, abs_tol=ABS_TOL), (
            f"{name}: Volt {ours.flatten().tolist()} != torchmetrics {torchmetrics.__version__}'s "
            f"{theirs.flatten().tolist()}")
