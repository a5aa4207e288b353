// `volt-checkpoint`: the `volt checkpoint` commands, which read checkpoints and so need LibTorch.
// The `volt` tool links no LibTorch; `volt checkpoint ...` runs this binary, installed beside it.
//
//   volt checkpoint to-safetensors lightning_logs/version_0/checkpoints/last.ckpt model.safetensors
//   volt checkpoint to-dcp lightning_logs/version_0/checkpoints/last.ckpt dcp/ [--prefix model.]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "volt/checkpoint/state_dict_export.h"
#include "volt/cli/run_main.h"

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << fmt::format("error: {}\nHINT: run `volt checkpoint --help` for the commands and their arguments.\n",
                             e.what());
    return volt::kExitUsage;
  }
  return volt::run_main([&] {
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
