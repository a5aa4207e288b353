// Computes Volt's metrics on the inputs test_metrics_torchmetrics.py writes, which compares the
// values with torchmetrics' on the same inputs. Many cases go in one launch, since loading
// libtorch costs more than all the metrics together.
//
//   metrics_interop_tool <cases.json>
//       cases.json is {"cases": [case, ...]} with
//         case   = {"name": str, "metric": str, "options": {...}, "batches": [{"preds": tensor, "target": tensor}]}
//         tensor = {"dtype": "float32" | "float64" | "int64" | "bool", "shape": [...], "values": [...flattened...]}
//       "metric" is a Volt class name (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall,
//       MulticlassF1Score, MulticlassConfusionMatrix, BinaryAUROC, MulticlassAUROC,
//       MeanSquaredError); "options" may hold num_classes, top_k and average ("micro", "macro").
//       Each case's metric is updated once per batch, in order, then computed. Prints one JSON
//       object on stdout: name -> {"shape": [...], "values": [...flattened, as double...]}, or
//       name -> {"error": message} when Volt rejected the case (volt::Error).
//
// Exits 2 with the message on stderr when cases.json itself is malformed.
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/metrics/metrics.h"

namespace {

using Json = nlohmann::ordered_json;

torch::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return torch::kFloat;
  if (name == "float64") return torch::kDouble;
  if (name == "int64") return torch::kLong;
  if (name == "bool") return torch::kBool;
  throw volt::Error("unknown dtype \"" + name + "\"; expected float32, float64, int64 or bool");
}

// The values travel as JSON numbers: float32 and small integers are exact as doubles.
torch::Tensor tensor_from_json(const Json& json) {
  const auto values = json.at("values").get<std::vector<double>>();
  const auto shape = json.at("shape").get<std::vector<int64_t>>();
  return torch::tensor(values, torch::kDouble).view(shape).to(parse_dtype(json.at("dtype").get<std::string>()));
}

Json tensor_to_json(const torch::Tensor& tensor) {
  const torch::Tensor values = tensor.contiguous().to(torch::kDouble).flatten();
  Json flat = Json::array();
  const double* data = values.data_ptr<double>();
  for (int64_t i = 0; i < values.numel(); ++i) flat.push_back(data[i]);
  Json json = Json::object();
  json["shape"] = tensor.sizes().vec();
  json["values"] = flat;
  return json;
}

volt::ClassificationOptions classification_options(const Json& options) {
  volt::ClassificationOptions parsed;
  parsed.num_classes = options.at("num_classes").get<int64_t>();
  parsed.top_k = options.value("top_k", parsed.top_k);
  if (options.contains("average")) parsed.average = volt::parse_average(options.at("average").get<std::string>());
  return parsed;
}

std::unique_ptr<volt::Metric> make_metric(const std::string& metric, const Json& options) {
  if (metric == "MulticlassAccuracy")
    return std::make_unique<volt::MulticlassAccuracy>(classification_options(options));
  if (metric == "MulticlassPrecision") {
    return std::make_unique<volt::MulticlassPrecision>(classification_options(options));
  }
  if (metric == "MulticlassRecall") return std::make_unique<volt::MulticlassRecall>(classification_options(options));
  if (metric == "MulticlassF1Score") return std::make_unique<volt::MulticlassF1Score>(classification_options(options));
  if (metric == "MulticlassConfusionMatrix") {
    return std::make_unique<volt::MulticlassConfusionMatrix>(options.at("num_classes").get<int64_t>());
  }
  if (metric == "BinaryAUROC") return std::make_unique<volt::BinaryAUROC>();
  if (metric == "MulticlassAUROC") {
    return std::make_unique<volt::MulticlassAUROC>(options.at("num_classes").get<int64_t>());
  }
  if (metric == "MeanSquaredError") return std::make_unique<volt::MeanSquaredError>();
  throw volt::Error("unknown metric \"" + metric + "\"");
}

// One case's value, or the error Volt gave for it (reported per case, so one rejected case does
// not hide the others' results).
Json run_case(const Json& spec) {
  try {
    const std::unique_ptr<volt::Metric> metric =
        make_metric(spec.at("metric").get<std::string>(), spec.value("options", Json::object()));
    for (const Json& batch : spec.at("batches")) {
      metric->update(tensor_from_json(batch.at("preds")), tensor_from_json(batch.at("target")));
    }
    return tensor_to_json(metric->compute());
  } catch (const volt::Error& error) {
    return Json{{"error", error.what()}};
  }
}

int run(const std::string& path) {
  std::ifstream in(path);
  VOLT_CHECK(in.good(), "cannot read {}", path);
  const Json input = Json::parse(in);
  Json results = Json::object();
  for (const Json& spec : input.at("cases")) results[spec.at("name").get<std::string>()] = run_case(spec);
  // nlohmann prints doubles with enough digits to round-trip, so Python sees Volt's exact values.
  std::cout << results.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 2) return run(argv[1]);
    std::cerr << "usage: metrics_interop_tool <cases.json>\n";
    return 64;
  } catch (const std::exception& error) {  // volt::Error or nlohmann's parse and type errors
    std::cerr << error.what() << "\n";
    return 2;
  }
}
