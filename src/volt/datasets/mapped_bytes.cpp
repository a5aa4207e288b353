#include "volt/datasets/mapped_bytes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "volt/core/error.h"

namespace volt::datasets::internal {

MappedBytes::MappedBytes(const std::string& path, int64_t offset, int64_t length) {
  if (length == 0) return;
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t aligned = offset / page * page;
  skew_ = offset - aligned;
  length_ = static_cast<size_t>(length + skew_);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VOLT_CHECK(fd >= 0,
             "cannot open {}: {}. HINT: check that the file still exists and is readable; it may have moved since its "
             "header was read.",
             path, std::strerror(errno));
  void* base = ::mmap(nullptr, length_, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(aligned));
  const int error = errno;
  ::close(fd);
  VOLT_CHECK(base != MAP_FAILED,
             "cannot map {} bytes of {} at {}: {}. HINT: check that the file's filesystem supports mmap and that "
             "`ulimit -v` leaves room for the mapping.",
             length, path, offset, std::strerror(error));
  base_ = static_cast<uint8_t*>(base);
  // Read ahead and drop behind: the reader goes through the range once, front to back.
  ::madvise(base_, length_, MADV_SEQUENTIAL);
}

MappedBytes::~MappedBytes() {
  if (base_) ::munmap(base_, length_);
}

void MappedBytes::release_before(int64_t used) {
  if (!base_) return;
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t end = (used + skew_) / page * page;
  if (end <= released_) return;
  ::madvise(base_ + released_, static_cast<size_t>(end - released_), MADV_DONTNEED);
  released_ = end;
}

}  // namespace volt::datasets::internal
