// libFuzzer target for the SLURM hostlist parser: any input must either expand or throw
// volt::Error; a crash, a hang, another exception or a broken invariant is a bug.
#include <cstdlib>
#include <string>

#include "volt/core/error.h"
#include "volt/slurm/hostlist.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    const auto hosts = volt::slurm::expand_hostlist(input);
    if (hosts.empty() || hosts.size() > volt::slurm::kMaxHosts) std::abort();
    for (const auto& host : hosts)
      if (host.empty()) std::abort();
    if (volt::slurm::first_host(input) != hosts.front()) std::abort();
  } catch (const volt::Error&) {
    // Malformed input is reported, as it must be.
  }
  return 0;
}
