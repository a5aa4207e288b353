// `volt-checkpoint`: the `volt checkpoint` commands, which read checkpoints and so need LibTorch.
// The `volt` tool links no LibTorch; `volt checkpoint ...` runs this binary, installed beside it.
//
//   volt checkpoint to-safetensors lightning_logs/version_0/checkpoints/last.ckpt model.safetensors
//   volt checkpoint to-dcp lightning_logs/version_0/checkpoints/last.ckpt dcp/ [--weights-only]
//   volt checkpoint to-dcp last.ckpt dcp/ --layout safetensors [--prefix model.]
//   volt checkpoint from-dcp pytorch_dcp/ model.safetensors [--prefix model.]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "volt/checkpoint/dcp_checkpoint.h"
#include "volt/checkpoint/dcp_writer.h"
#include "volt/checkpoint/safetensors.h"
#include "volt/checkpoint/state_dict_export.h"
#include "volt/cli/run_main.h"
#include "volt/core/error.h"

int main(int argc, char** argv) {
  CLI::App app("volt checkpoint: convert Volt (and Lightning) checkpoints.", "volt checkpoint");
  app.require_subcommand(1);
  std::string checkpoint, out;
  CLI::App* to = app.add_subcommand(
      "to-safetensors",
      "Write a checkpoint's state_dict (the model's parameters and buffers, named as stored) to a safetensors file "
      "with metadata {\"format\": \"pt\"}. A sharded fsdp checkpoint is consolidated first (its shard files beside "
      "it; the whole model must fit in memory).");
  to->add_option("checkpoint", checkpoint, "the .ckpt file")->required();
  to->add_option("out", out, "the .safetensors file to write (atomically)")->required();
  std::string folder, prefix, layout = "native";
  bool weights_only = false;
  CLI::App* dcp = app.add_subcommand(
      "to-dcp",
      "Write a checkpoint into a folder that PyTorch 2.x's torch.distributed.checkpoint loads at any world size, "
      "into plain or FSDP2 models: by default in its own layout (.metadata and a .distcp file per process: "
      "\"model.<name>\" and the optimizers' state as get_optimizer_state_dict keys it, for dcp.load(state, "
      "checkpoint_id=DIR) and dcp_to_torch_save), or with --layout safetensors the state_dict only, for "
      "HuggingFaceStorageReader. A sharded fsdp checkpoint's pieces stay as each process wrote them (nothing is "
      "consolidated).");
  dcp->add_option("checkpoint", checkpoint, "the .ckpt file (a sharded one's shard files beside it)")->required();
  dcp->add_option("out", folder, "the folder to write (new, or without a distributed checkpoint in it)")->required();
  dcp->add_option("--layout", layout, "native (PyTorch's own: .metadata + .distcp) or safetensors")
      ->check(CLI::IsMember({"native", "safetensors"}));
  dcp->add_flag("--weights-only", weights_only, "native layout: the model's state only, no optimizer state");
  dcp->add_option("--prefix", prefix,
                  "safetensors layout: put before every name, e.g. model. for dcp.load({\"model\": sd}, ...)");
  std::string from_prefix;
  CLI::App* from = app.add_subcommand(
      "from-dcp",
      "Write the tensors of a distributed checkpoint that PyTorch 2.x saved (dcp.save with its default writer: "
      ".metadata + .distcp files, any world size, FSDP or not) to a safetensors file, each tensor whole.");
  from->add_option("folder", folder, "the folder dcp.save wrote")->required();
  from->add_option("out", out, "the .safetensors file to write (atomically)")->required();
  from->add_option("--prefix", from_prefix,
                   "only the tensors whose names start with it, written without it, e.g. model. for "
                   "dcp.save({\"model\": sd}, ...) (default: every tensor, names as saved)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << fmt::format("error: {}\nHINT: run `volt checkpoint --help` for the commands and their arguments.\n",
                             e.what());
    return volt::kExitUsage;
  }
  return volt::run_main([&] {
    if (from->parsed()) {
      const volt::DcpCheckpoint checkpoint = volt::DcpCheckpoint::open(folder);
      volt::NamedTensors tensors;
      for (const std::string& name : checkpoint.tensor_names()) {
        if (name.rfind(from_prefix, 0) == 0)
          tensors.emplace_back(name.substr(from_prefix.size()), checkpoint.read(name));
      }
      if (tensors.empty()) {
        throw volt::CheckpointError(fmt::format(
            "the distributed checkpoint {} has no tensor whose name starts with '{}' ({} tensors). HINT: leave "
            "--prefix out to write them all with their names.",
            folder, from_prefix, checkpoint.tensor_names().size()));
      }
      volt::save_safetensors(out, tensors, {{"format", "pt"}});
      std::cout << fmt::format("volt: wrote {} tensors of the distributed checkpoint {} to {}\n", tensors.size(),
                               folder, out);
      return 0;
    }
    if (dcp->parsed() && layout == "native") {
      if (!prefix.empty()) {
        throw volt::Error(fmt::format(
            "--prefix '{}' names the entries of the safetensors layout; the native layout names them as "
            "dcp.save({{\"model\": ..., \"optim\": ...}}) does. HINT: add --layout safetensors, or leave --prefix out.",
            prefix));
      }
      const size_t entries = volt::save_checkpoint_as_dcp_native(checkpoint, folder, weights_only);
      std::cout << fmt::format("volt: wrote {} to {} in PyTorch's distributed checkpoint layout ({} entries{})\n",
                               checkpoint, folder, entries, weights_only ? ", the model's state only" : "");
      return 0;
    }
    if (dcp->parsed()) {
      const size_t files = volt::save_checkpoint_as_dcp(checkpoint, folder, prefix);
      std::cout << fmt::format("volt: wrote {}'s state_dict to {} ({} safetensors files with DCP_SHARDING_INFO)\n",
                               checkpoint, folder, files);
      return 0;
    }
    const size_t count = volt::save_state_dict_as_safetensors(checkpoint, out);
    std::cout << fmt::format("volt: wrote the {} tensors of {}'s state_dict to {}\n", count, checkpoint, out);
    return 0;
  });
}
