// `volt-checkpoint`: the `volt checkpoint` commands, which read checkpoints and so need LibTorch.
// The `volt` tool links no LibTorch; `volt checkpoint ...` runs this binary, installed beside it.
//
//   volt checkpoint to-safetensors lightning_logs/version_0/checkpoints/last.ckpt model.safetensors
//   volt checkpoint to-dcp lightning_logs/version_0/checkpoints/last.ckpt dcp/ [--prefix model.]
//   volt checkpoint from-dcp pytorch_dcp/ model.safetensors [--prefix model.]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "volt/checkpoint/dcp_checkpoint.h"
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
  std::string folder, prefix;
  CLI::App* dcp = app.add_subcommand(
      "to-dcp",
      "Write a checkpoint's state_dict into a folder that PyTorch 2.x's torch.distributed.checkpoint loads with "
      "HuggingFaceStorageReader, at any world size: a sharded fsdp checkpoint's pieces stay as each process wrote "
      "them (nothing is consolidated).");
  dcp->add_option("checkpoint", checkpoint, "the .ckpt file (a sharded one's shard files beside it)")->required();
  dcp->add_option("out", folder, "the folder to write (new or without .safetensors files)")->required();
  dcp->add_option("--prefix", prefix, "put before every name, e.g. model. for dcp.load({\"model\": sd}, ...)");
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
