#include "volt/loops/stage_profile.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/profiler/profiler.h"
#include "volt/strategies/strategy.h"

namespace volt {

std::string stage_profile_path(const std::string& dir, const std::string& prefix, const std::string& stage,
                               int64_t rank, const std::string& suffix) {
  return (std::filesystem::path(dir) / fmt::format("{}-{}-rank{}{}", prefix, stage, rank, suffix)).string();
}

std::string finish_stage_profile(Profiler& profiler, Strategy& strategy, Console& console, const std::string& dir) {
  const double seconds = profiler.end_stage();
  if (!profiler.kind()) return "";
  const Topology& topology = strategy.topology();
  const std::string mine = format_profile(profiler.stats(), profiler.stage(), seconds);
  std::string across;
  if (topology.world_size > 1) {
    // Host first, on its own line: host names have no line breaks, the statistics no host.
    const std::string host = topology.host.empty() ? "?" : topology.host;
    std::vector<ProfileStats> ranks;
    std::vector<std::string> hosts;
    for (const std::string& text :
         strategy.collectives().all_gather_bytes(host + "\n" + encode_profile_stats(profiler.stats()))) {
      const size_t line = text.find('\n');
      VOLT_INTERNAL_ASSERT(line != std::string::npos, "profile exchange without a host line: '{}'", text);
      hosts.push_back(text.substr(0, line));
      ranks.push_back(decode_profile_stats(text.substr(line + 1)));
    }
    across = "\n" + format_profile_across_ranks(ranks, hosts);
  }
  const std::string report = mine + across;
  console.info(report);
  std::filesystem::create_directories(dir);
  const std::string path = stage_profile_path(dir, "profile", profiler.stage(), topology.global_rank, ".txt");
  std::ofstream out(path, std::ios::trunc);
  out << report;
  out.close();
  if (!out.good()) {
    console.warn(fmt::format("profiler: could not write {}; the report above is all there is.", path));
  }
  if (!profiler.trace_written().empty()) {
    console.info(fmt::format("Profiler trace (open it in https://ui.perfetto.dev or chrome://tracing): {}",
                             profiler.trace_written()));
  }
  return path;
}

}  // namespace volt
