// What serializing a checkpoint costs the writer: a snapshot's background write (and a synchronous
// save) first turns the state into torch.save's zip archive in memory (volt::save_to_bytes), then
// writes it. A state of --mb megabytes in --tensors float tensors (GPT-2 small with AdamW's moments:
// 1536 MB in 450 tensors) is serialized three ways, interleaved and repeated:
//   memcpy        the tensors' bytes copied into fresh memory: the floor any serializer pays
//   torch         LibTorch's own torch::pickle_save (the same zip writer and pickler): the baseline
//   volt          volt::save_to_bytes
//   volt-reused   volt::save_to_bytes into the buffer of the previous repeat's (a snapshot writer's)
// and written to a file in --dir two ways (fsync'd, so the disk's speed is in both):
//   bytes+file    save_to_bytes, then the bytes written (how save_checkpoint_file wrote until now)
//   file          volt::save_checkpoint_file, which streams the archive into the file
// It prints each one's median seconds (min and max), volt's ratio to torch and to memcpy and file's
// to bytes+file, and checks once that volt's archive loads back to the same tensors (exit 1
// otherwise).
//
//   bench_checkpoint_write                          # 1536 MB, 5 repeats
//   bench_checkpoint_write --mb 64 --repeats 1      # what CTest runs
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_stats.h"
#include "volt/checkpoint/checkpoint_io.h"

namespace {

using Clock = std::chrono::steady_clock;
using volt::bench::median;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("What serializing a checkpoint costs: memcpy, torch::pickle_save and volt::save_to_bytes",
               "bench_checkpoint_write");
  int64_t mb = 1536;
  int64_t tensors = 450;
  int64_t repeats = 5;
  std::string dir = (std::filesystem::temp_directory_path() / "volt-bench-checkpoint-write").string();
  app.add_option("--mb", mb, "megabytes of state")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "tensors it is split into")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "runs of each contender, interleaved")->capture_default_str();
  app.add_option("--dir", dir, "where the files go (removed at the end)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);

  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  const int64_t per_tensor = std::max<int64_t>(1, mb * 1024 * 1024 / 4 / tensors);
  for (int64_t i = 0; i < tensors; ++i) state.insert("t" + std::to_string(i), torch::rand({per_tensor}));
  const c10::IValue value(state);

  const std::vector<std::string> contenders{"memcpy", "torch", "volt", "volt-reused", "bytes+file", "file"};
  std::vector<char> reused;  // volt-reused's buffer, kept from one repeat to the next
  std::filesystem::create_directories(dir);
  const std::string path = (std::filesystem::path(dir) / "state.ckpt").string();
  std::map<std::string, std::vector<double>> times;
  size_t archive_bytes = 0;
  [[maybe_unused]] volatile char sink = 0;
  for (int64_t r = 0; r < repeats; ++r) {
    for (const std::string& c : contenders) {
      const auto start = Clock::now();
      if (c == "memcpy") {
        // Not a std::vector: it would zero its pages first, a second pass over the memory.
        const std::unique_ptr<char[]> copy(new char[static_cast<size_t>(per_tensor * tensors * 4)]);
        size_t at = 0;
        for (const auto& entry : state) {
          const at::Tensor& t = entry.value().toTensor();
          std::memcpy(copy.get() + at, t.data_ptr(), t.nbytes());
          at += t.nbytes();
        }
        sink = copy[at - 1];  // the copy is read, so it is not optimized away
      } else if (c == "volt-reused") {
        volt::save_to_bytes(value, reused);
      } else if (c == "torch") {
        const std::vector<char> bytes = torch::pickle_save(value);
      } else if (c == "bytes+file") {
        const std::vector<char> bytes = volt::save_to_bytes(value);
        volt::write_file_atomically(path, [&](const volt::ByteSink& sink) { sink(bytes.data(), bytes.size()); });
      } else if (c == "file") {
        volt::save_checkpoint_file(value, path);
      } else {
        const std::vector<char> bytes = volt::save_to_bytes(value);
        archive_bytes = bytes.size();
        if (r == 0) {
          const c10::impl::GenericDict loaded = volt::load_from_bytes(bytes).toGenericDict();
          for (const auto& entry : state) {
            if (!loaded.at(entry.key()).toTensor().equal(entry.value().toTensor())) {
              std::cerr << "volt's archive does not load back to the same tensors\n";
              return 1;
            }
          }
        }
      }
      times[c].push_back(seconds_since(start));
    }
  }
  for (const std::string& c : contenders) {
    const auto [lo, hi] = std::minmax_element(times[c].begin(), times[c].end());
    std::cout << c << (c.size() < 11 ? std::string(11 - c.size(), ' ') : "") << "  median " << median(times[c])
              << " s (min " << *lo << ", max " << *hi << ")\n";
  }
  std::cout << "archive " << archive_bytes / 1000000 << " MB; volt/torch "
            << median(times["volt"]) / median(times["torch"]) << "x, volt/memcpy "
            << median(times["volt"]) / median(times["memcpy"]) << "x, volt-reused/volt "
            << median(times["volt-reused"]) / median(times["volt"]) << "x, file/bytes+file "
            << median(times["file"]) / median(times["bytes+file"]) << "x\n";
  std::filesystem::remove_all(dir);
  return 0;
}
