// Writes and reads checkpoints for test_checkpoint_interop.py, which checks them against
// Python's torch.save / torch.load.
//
//   checkpoint_interop_tool write <ckpt> <dir>
//       Saves a Lightning-layout checkpoint of a fixed, seeded module to <ckpt>, and dumps each
//       state_dict tensor as raw little-endian float32 to <dir>/<name>.bin, with
//       <dir>/manifest.json mapping names (in state_dict order) to shapes.
//   checkpoint_interop_tool read <ckpt>
//       Loads <ckpt> and prints it as JSON on stdout; a tensor becomes
//       {"dtype": ..., "shape": [...], "values": [...flattened...]}.
//   checkpoint_interop_tool dcp-weights <dir> <prefix> <name> <d0,d1,...> <begin> <end>
//       Prints, as JSON, what volt::DcpWeights over the distributed checkpoint <dir> gives a fit
//       that asks for elements [begin, end) of parameter <name> of that shape.
//   checkpoint_interop_tool dcp-fit <dir> <root> <devices> <strategy> <max_steps> <dump>
//       Trainer::fit of test_dcp_interop.py's Net (fc1 4->5, fc2 5->3) with Adam(lr=1e-2) from
//       ckpt_path=<dir> (a folder PyTorch's dcp.save wrote) until global step <max_steps>, under
//       <strategy> ("auto", "fsdp", ...) on <devices> processes. Rank 0 writes, as a Volt
//       checkpoint file <dump>: "optimizer" and "weights" (what the optimizer and the module hold
//       right after the restore, when the fit runs in one process), "world_size", "start_step" and
//       "end_step".
//
// Exits 2 with the message on stderr when the checkpoint is rejected (volt::Error).
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/dcp_checkpoint.h"
#include "volt/core/error.h"
#include "volt/optim/optimizer_state.h"
#include "volt/volt.h"

namespace {

using Json = nlohmann::ordered_json;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(4, 3))), fc2(register_module("fc2", torch::nn::Linear(3, 2))) {
    register_buffer("scale", torch::tensor({0.5f, -1.25f}));
  }
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

c10::impl::GenericList list_of(std::initializer_list<c10::IValue> items) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& item : items) list.push_back(item);
  return list;
}

// The checkpoint layout Lightning writes, holding plain values only.
c10::IValue lightning_checkpoint(const Net& net) {
  auto state_dict = string_dict();
  for (const auto& item : net->named_parameters()) state_dict.insert(item.key(), item.value());
  for (const auto& item : net->named_buffers()) state_dict.insert(item.key(), item.value());

  // The layout of torch.optim.Adam.state_dict(): int keys for parameter indices.
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  int64_t index = 0;
  for (const auto& parameter : net->parameters()) {
    auto param_state = string_dict();
    param_state.insert("step", torch::tensor(3.0f));
    param_state.insert("exp_avg", torch::full_like(parameter, 0.125));
    param_state.insert("exp_avg_sq", torch::full_like(parameter, 0.0625));
    state.insert(index++, param_state);
  }
  auto group = string_dict();
  group.insert("lr", 0.001);
  group.insert("betas", c10::ivalue::Tuple::create({c10::IValue(0.9), c10::IValue(0.999)}));
  group.insert("eps", 1e-8);
  group.insert("weight_decay", 0.0);
  group.insert("amsgrad", false);
  group.insert("params", list_of({int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}}));
  auto optimizer = string_dict();
  optimizer.insert("state", state);
  optimizer.insert("param_groups", list_of({group}));

  auto hyper_parameters = string_dict();
  hyper_parameters.insert("lr", 0.001);
  hyper_parameters.insert("name", "x");
  hyper_parameters.insert("flag", true);
  hyper_parameters.insert("layers", list_of({int64_t{1}, int64_t{2}}));
  hyper_parameters.insert("scheduler", c10::IValue());

  auto progress = string_dict();
  progress.insert("ready", int64_t{10});
  progress.insert("completed", int64_t{10});
  auto batch_progress = string_dict();
  batch_progress.insert("total", progress);
  auto epoch_loop = string_dict();
  epoch_loop.insert("batch_progress", batch_progress);
  auto loops = string_dict();
  loops.insert("fit_loop", epoch_loop);

  auto checkpoint = string_dict();
  checkpoint.insert("epoch", int64_t{1});
  checkpoint.insert("global_step", int64_t{10});
  checkpoint.insert("pytorch-lightning_version", "2.1.0");
  checkpoint.insert("state_dict", state_dict);
  checkpoint.insert("optimizer_states", list_of({optimizer}));
  checkpoint.insert("lr_schedulers", c10::impl::GenericList(c10::AnyType::get()));
  checkpoint.insert("hyper_parameters", hyper_parameters);
  checkpoint.insert("loops", loops);
  return checkpoint;
}

void write_raw_float32(const at::Tensor& tensor, const std::string& path) {
  static_assert(sizeof(float) == 4);
  const at::Tensor values = tensor.detach().to(torch::kFloat32).contiguous();
  // The test machines are little-endian; the dump is defined as little-endian float32.
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data_ptr<float>()),
            static_cast<std::streamsize>(values.numel() * sizeof(float)));
  VOLT_CHECK(out.good(), "could not write {}", path);
}

int write_mode(const std::string& ckpt, const std::string& dir) {
  torch::manual_seed(1234);
  Net net;
  volt::save_checkpoint_file(lightning_checkpoint(net), ckpt);
  Json manifest = Json::object();
  auto dump = [&](const std::string& name, const at::Tensor& tensor) {
    write_raw_float32(tensor, dir + "/" + name + ".bin");
    manifest[name] = tensor.sizes().vec();
  };
  for (const auto& item : net->named_parameters()) dump(item.key(), item.value());
  for (const auto& item : net->named_buffers()) dump(item.key(), item.value());
  std::ofstream(dir + "/manifest.json") << manifest.dump(2) << "\n";
  return 0;
}

Json to_json(const c10::IValue& value);

Json tensor_to_json(const at::Tensor& tensor) {
  const at::Tensor values = tensor.contiguous().to(torch::kFloat64).flatten();
  Json json = Json::object();
  json["dtype"] = c10::toString(tensor.scalar_type());
  json["shape"] = tensor.sizes().vec();
  Json flat = Json::array();
  const double* data = values.data_ptr<double>();
  for (int64_t i = 0; i < values.numel(); ++i) flat.push_back(data[i]);
  json["values"] = flat;
  return json;
}

Json to_json(const c10::IValue& value) {
  if (value.isNone()) return nullptr;
  if (value.isBool()) return value.toBool();
  if (value.isInt()) return value.toInt();
  if (value.isDouble()) return value.toDouble();
  if (value.isString()) return value.toStringRef();
  if (value.isTensor()) return tensor_to_json(value.toTensor());
  if (value.isList()) {
    Json json = Json::array();
    for (const c10::IValue& item : value.toListRef()) json.push_back(to_json(item));
    return json;
  }
  if (value.isTuple()) {
    Json json = Json::array();
    for (const c10::IValue& item : value.toTupleRef().elements()) json.push_back(to_json(item));
    return json;
  }
  if (value.isGenericDict()) {
    Json json = Json::object();
    for (const auto& entry : value.toGenericDict()) {
      const c10::IValue& key = entry.key();
      json[key.isString() ? key.toStringRef() : c10::str(key)] = to_json(entry.value());
    }
    return json;
  }
  throw volt::Error(fmt::format("cannot print a value of type {} as JSON", value.tagKind()));
}

int read_mode(const std::string& ckpt) {
  // Full precision, so Python can compare doubles exactly.
  std::cout << to_json(volt::load_checkpoint_file(ckpt)).dump() << "\n";
  return 0;
}

int dcp_weights_mode(char** argv) {
  volt::DcpWeights weights(volt::DcpCheckpoint::open(argv[2]), argv[3]);
  std::vector<int64_t> shape;
  std::stringstream dims(argv[5]);
  for (std::string dim; std::getline(dims, dim, ',');) shape.push_back(std::stoll(dim));
  std::cout << tensor_to_json(weights.read(argv[4], shape, std::stoll(argv[6]), std::stoll(argv[7]))).dump() << "\n";
  return 0;
}

// test_dcp_interop.py's Net and optimizer, so that a PyTorch checkpoint of them resumes here.
struct DcpNet : volt::LightningModule {
  torch::nn::Linear fc1 = register_module("fc1", torch::nn::Linear(4, 5));
  torch::nn::Linear fc2 = register_module("fc2", torch::nn::Linear(5, 3));
  std::shared_ptr<torch::optim::Adam> adam;
  bool dump_optimizer = false;
  c10::IValue restored_optimizer;
  c10::IValue restored_weights;
  int64_t start_step = -1;
  int64_t world_size_seen = 0;
  bool global_zero = false;

  torch::Tensor training_step(const volt::Batch& batch, int64_t) override {
    return fc2(torch::relu(fc1(batch.data))).pow(2).mean();
  }
  volt::OptimizerConfig configure_optimizers() override {
    adam = std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2));
    return adam;
  }
  volt::DataLoader train_dataloader() override {
    const at::Tensor x = torch::linspace(-1, 1, 64).reshape({16, 4});
    return volt::DataLoader(std::make_shared<volt::TensorDataset>(x, torch::zeros({16, 3})), {.batch_size = 4});
  }
  // The first hook after the restore: what the optimizer holds before any step (cloned, since
  // its tensors change as it steps).
  void on_train_start() override {
    start_step = global_step();
    global_zero = is_global_zero();
    world_size_seen = world_size();
    if (dump_optimizer) {
      restored_optimizer = volt::load_from_bytes(volt::save_to_bytes(volt::optimizer_state_dict(*adam)), "optimizer");
      c10::impl::GenericDict weights(c10::StringType::get(), c10::AnyType::get());
      for (const auto& item : named_parameters()) weights.insert(item.key(), item.value().detach().clone());
      restored_weights = weights;
    }
  }
};

int dcp_fit_mode(char** argv) {
  DcpNet net;
  const int devices = std::stoi(argv[4]);
  net.dump_optimizer = devices == 1;
  volt::TrainerOptions options;
  options.accelerator = volt::AcceleratorRequest::kCpu;
  options.devices = devices;
  options.strategy = volt::parse_strategy_request(argv[5]);
  options.max_steps = std::stoll(argv[6]);
  options.default_root_dir = argv[3];
  options.num_threads = 1;
  options.logger = false;
  options.enable_checkpointing = false;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  volt::Trainer trainer(options);
  const volt::FitResult result = trainer.fit(net, {}, {}, argv[2]);
  if (!net.global_zero) return 0;
  c10::impl::GenericDict dump(c10::StringType::get(), c10::AnyType::get());
  if (net.dump_optimizer) {
    dump.insert("optimizer", net.restored_optimizer);
    dump.insert("weights", net.restored_weights);
  }
  dump.insert("world_size", net.world_size_seen);
  dump.insert("start_step", net.start_step);
  dump.insert("end_step", result.global_step);
  volt::save_checkpoint_file(dump, argv[7]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: checkpoint_interop_tool write <ckpt> <dir> | read <ckpt> | dcp-weights <dir> <prefix> <name> <shape> "
      "<begin> <end> | dcp-fit <dir> <root> <devices> <strategy> <max_steps> <dump>";
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 4) return write_mode(argv[2], argv[3]);
    if (mode == "read" && argc == 3) return read_mode(argv[2]);
    if (mode == "dcp-weights" && argc == 8) return dcp_weights_mode(argv);
    if (mode == "dcp-fit" && argc == 8) return dcp_fit_mode(argv);
    std::cerr << usage << "\n";
    return 64;
  } catch (const volt::Error& error) {
    std::cerr << error.what() << "\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "unexpected error: " << error.what() << "\n";
    return 3;
  }
}
