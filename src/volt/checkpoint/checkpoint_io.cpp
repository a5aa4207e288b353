#include "volt/checkpoint/checkpoint_io.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <system_error>
#include <utility>

#include "volt/checkpoint/plain_unpickler.h"
#include "volt/core/error.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRecoveryHint =
    "HINT: delete it and resume from the previous checkpoint, or point ckpt_path at another file.";

// Key paths read like Python subscripts, so `["state_dict"]["fc.weight"]` can be pasted into a
// Python session that holds the same dict.
std::string key_path_or_root(const std::string& path) { return path.empty() ? "<root>" : path; }

at::Tensor plain_tensor(const at::Tensor& tensor, const std::string& path) {
  VOLT_INTERNAL_ASSERT(tensor.defined(), "checkpoint value at {} is an undefined tensor", key_path_or_root(path));
  VOLT_INTERNAL_ASSERT(tensor.layout() == at::kStrided && !tensor.is_quantized(),
                       "checkpoint tensor at {} has layout {} (quantized: {}); only dense tensors "
                       "are plain. HINT: convert it with .to_dense() / .dequantize() before saving",
                       key_path_or_root(path), c10::str(tensor.layout()), tensor.is_quantized());
  // Detached, since a checkpoint holds values, not autograd graphs; on CPU, since the file must
  // load where the device it came from does not exist.
  at::Tensor result = tensor.detach().to(at::kCPU);
  // A view would drag its whole base storage into the file (torch.save writes storages), and
  // the pickler writes storages as they lie in memory: copy to a compact, contiguous tensor.
  const bool compact =
      result.is_contiguous() && result.storage_offset() == 0 && result.storage().nbytes() == result.nbytes();
  if (!compact) result = result.clone(at::MemoryFormat::Contiguous);
  return result;
}

// Returns a copy of `value` whose containers are generic (Any-typed) and whose tensors are plain
// CPU tensors, or throws naming the key path of the first value that is not plain. Generic
// containers matter: the pickler writes typed lists (int[], float[], Tensor[]) as calls to
// `torch.jit._pickle.build_*list`, globals the weights-only loader rejects.
c10::IValue to_plain(const c10::IValue& value, const std::string& path) {
  if (value.isNone() || value.isBool() || value.isInt() || value.isDouble() || value.isString()) {
    return value;
  }
  if (value.isTensor()) return plain_tensor(value.toTensor(), path);
  if (value.isList()) {
    const c10::List<c10::IValue> list = value.toList();
    c10::impl::GenericList out(c10::AnyType::get());
    out.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      out.push_back(to_plain(list.get(i), fmt::format("{}[{}]", path, i)));
    }
    return out;
  }
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    std::vector<c10::IValue> out;
    out.reserve(elements.size());
    for (size_t i = 0; i < elements.size(); ++i) {
      out.push_back(to_plain(elements[i], fmt::format("{}[{}]", path, i)));
    }
    return c10::ivalue::Tuple::create(std::move(out));
  }
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    // One key kind per dict: c10::Dict is typed by key, and both kinds are plain in Python
    // (string keys for layouts and state_dicts, int keys for optimizer states).
    const bool int_keys = !dict.empty() && dict.begin()->key().isInt();
    const c10::TypePtr key_type = int_keys ? c10::TypePtr(c10::IntType::get()) : c10::TypePtr(c10::StringType::get());
    c10::impl::GenericDict out(key_type, c10::AnyType::get());
    out.reserve(dict.size());
    for (const auto& entry : dict) {
      const c10::IValue& key = entry.key();
      const std::string key_text = key.isString() ? fmt::format("[\"{}\"]", key.toStringRef())
                                   : key.isInt()  ? fmt::format("[{}]", key.toInt())
                                                  : std::string("[?]");
      VOLT_INTERNAL_ASSERT(int_keys ? key.isInt() : key.isString(),
                           "checkpoint dict at {} has a key of type {}; expected all keys to be "
                           "{}. HINT: use string keys (or int keys) throughout one dict",
                           key_path_or_root(path), key.tagKind(), int_keys ? "int" : "string");
      out.insert(key, to_plain(entry.value(), path + key_text));
    }
    return out;
  }
  VOLT_INTERNAL_ASSERT(false,
                       "checkpoint value at {} has type {}; expected only dicts, lists, tuples, "
                       "strings, ints, doubles, bools, None and tensors, so that Python's "
                       "torch.load(weights_only=True) can read it. HINT: convert it to one of "
                       "these before putting it into the checkpoint",
                       key_path_or_root(path), value.tagKind());
  return {};
}

// The first line of a c10::Error, without LibTorch's C++ backtrace.
std::string short_message(const c10::Error& error) {
  std::string message = error.what_without_backtrace();
  const auto newline = message.find('\n');
  if (newline != std::string::npos) message.resize(newline);
  return message;
}

c10::IValue read_archive(caffe2::serialize::PyTorchStreamReader& reader, const std::string& what) {
  if (!reader.hasRecord("data.pkl")) {
    throw CheckpointError(
        fmt::format("{} is truncated or corrupt (a record is missing: the zip archive has no data.pkl; it "
                    "holds [{}]). Expected a torch.save archive. {}",
                    what, fmt::join(reader.getAllRecords(), ", "), kRecoveryHint));
  }
  try {
    // torch.save in PyTorch 2.x records the byte order; tensors are read as this machine's.
    if (reader.hasRecord("byteorder")) {
      auto [order, order_size] = reader.getRecord("byteorder");
      const std::string byteorder(static_cast<const char*>(order.get()), order_size);
      if (byteorder != "little") {
        throw CheckpointError(
            fmt::format("{} was written on a {}-endian machine; Volt reads little-endian checkpoints only. "
                        "HINT: re-save it with torch.save on a little-endian machine",
                        what, byteorder));
      }
    }
    auto [pickle, pickle_size] = reader.getRecord("data.pkl");
    const internal::ReadRecord read_record = [&](const std::string& key) {
      const std::string name = "data/" + key;
      if (!reader.hasRecord(name)) {
        throw CheckpointError(
            fmt::format("{} is truncated or corrupt (a record is missing: {} is not in the zip archive). {}", what,
                        name, kRecoveryHint));
      }
      auto [data, size] = reader.getRecord(name);
      return std::make_pair(std::move(data), size);
    };
    // Our own unpickler rather than readArchiveAndTensors: LibTorch 1.13's cannot read the
    // OrderedDict of a Python state_dict (see plain_unpickler.h).
    return internal::unpickle_plain(static_cast<const char*>(pickle.get()), pickle_size, read_record, what);
  } catch (const c10::Error& error) {
    // The zip layer checks sizes and CRCs of records as it reads them.
    throw CheckpointError(
        fmt::format("{} is truncated or corrupt ({}). {}", what, short_message(error), kRecoveryHint));
  }
}

c10::IValue open_and_read(const std::function<std::unique_ptr<caffe2::serialize::PyTorchStreamReader>()>& open,
                          const std::string& what) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = open();
  } catch (const c10::Error& error) {
    throw CheckpointError(fmt::format("{} is truncated or corrupt (not a readable zip archive: {}). {}", what,
                                      short_message(error), kRecoveryHint));
  }
  return read_archive(*reader, what);
}

// Every zip archive starts with a local file header.
constexpr char kZipMagic[] = {'P', 'K', '\x03', '\x04'};

std::string describe_bad_magic(const char* head, size_t size, const std::string& what) {
  // Python's legacy format (torch.save(..., _use_new_zipfile_serialization=False), the default
  // before PyTorch 1.6) starts with a pickle: 0x80 is its PROTO opcode.
  if (size > 0 && static_cast<unsigned char>(head[0]) == 0x80) {
    return fmt::format(
        "{} is in torch.save's legacy (non-zip) format, which Volt does not read; expected a zip "
        "archive. HINT: re-save it in Python: torch.save(torch.load(f), f)",
        what);
  }
  std::string hex;
  for (size_t i = 0; i < size; ++i) {
    hex += fmt::format("{}{:02x}", i == 0 ? "" : " ", static_cast<unsigned char>(head[i]));
  }
  return fmt::format(
      "{} is truncated or corrupt (not a zip archive: it starts with bytes [{}], expected "
      "[50 4b 03 04]). {}",
      what, hex, kRecoveryHint);
}

[[noreturn]] void throw_io_error(const std::string& step, const std::string& file, const std::string& path,
                                 int error_number) {
  throw CheckpointError(
      fmt::format("could not write checkpoint '{}': {} '{}' failed: {}. HINT: check that the directory "
                  "exists and is writable and that the disk has free space",
                  path, step, file, std::strerror(error_number)));
}

void write_all(int fd, const char* data, size_t size, const std::string& tmp, const std::string& path) {
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd, data + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io_error("write", tmp, path, errno);
    written += static_cast<size_t>(n);
  }
}

void fsync_directory(const fs::path& directory, const std::string& path) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io_error("open directory", directory.string(), path, errno);
  const int rc = ::fsync(fd);
  const int fsync_errno = errno;
  ::close(fd);
  if (rc != 0) throw_io_error("fsync directory", directory.string(), path, fsync_errno);
}

}  // namespace

namespace {

/// Writes torch.save's zip archive of `plain` (what to_plain returned) through `sink`, after
/// telling `reserve` how many bytes it will write at most. `sink` should not throw: the zip writer
/// calls it from C code, and its destructor writes again after an error. save_checkpoint_file
/// keeps a failed write's error until the end; save_to_bytes' sink throws only without memory.
void write_archive(const c10::IValue& plain, const std::function<void(size_t)>& reserve, const ByteSink& sink) {
  std::vector<char> pickle;
  // Mirrors torch::jit::pickle_save, except tag_aggregates=false: pickle_save wraps typed dicts
  // and lists in `torch.jit._pickle.restore_type_tag`, a global the weights-only loader rejects.
  // No tensor table: tensors are then written as torch.save does (`_rebuild_tensor_v2` over
  // persistent storage ids) and collected in tensorData().
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(plain);
  pickler.stop();

  // The whole archive's size, so that a buffer is reserved once: one growing by doubling would
  // copy a large checkpoint over and over into ever new pages (for 1.6 GB, 3.7 s instead of 1.3;
  // bench/checkpoint_write.cpp). The zip layer adds a header per record and its directory: far
  // below kZipBytesPerRecord for any record name, alignment padding included.
  constexpr size_t kZipBytesPerRecord = 512;
  constexpr size_t kZipRecordsBesideTensors = 8;  // data.pkl, version, byteorder, serialization id...
  size_t tensor_bytes = 0;
  for (const at::Tensor& tensor : pickler.tensorData()) tensor_bytes += tensor.storage().nbytes();
  reserve(pickle.size() + tensor_bytes + (pickler.tensorData().size() + kZipRecordsBesideTensors) * kZipBytesPerRecord);
  // A writer function gives the archive the name "archive", as torch.save into a buffer does.
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    sink(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  // Finish the zip (version record, central directory) now rather than in the writer's destructor.
  writer.writeEndOfFile();
}

}  // namespace

std::vector<char> save_to_bytes(const c10::IValue& value) {
  std::vector<char> archive;
  save_to_bytes(value, archive);
  return archive;
}

void save_to_bytes(const c10::IValue& value, std::vector<char>& archive) {
  // Validate (and copy to generic containers) before serializing, so a bad value throws before
  // any file is touched.
  const c10::IValue plain = to_plain(value, "");
  archive.clear();  // keeps the capacity
  write_archive(
      plain, [&](size_t size) { archive.reserve(size); },
      [&](const char* data, size_t size) { archive.insert(archive.end(), data, data + size); });
}

c10::IValue load_from_bytes(const std::vector<char>& bytes, const std::string& what) {
  if (bytes.empty()) {
    throw CheckpointError(
        fmt::format("{} is empty (0 bytes), expected a torch.save zip archive. {}", what, kRecoveryHint));
  }
  if (bytes.size() < sizeof(kZipMagic) || !std::equal(std::begin(kZipMagic), std::end(kZipMagic), bytes.begin())) {
    throw CheckpointError(describe_bad_magic(bytes.data(), std::min(bytes.size(), sizeof(kZipMagic)), what));
  }
  return open_and_read(
      [&] {
        return std::make_unique<caffe2::serialize::PyTorchStreamReader>(
            std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
      },
      what);
}

void save_checkpoint_file(const c10::IValue& value, const std::string& path) {
  const c10::IValue plain = to_plain(value, "");  // a bad value throws before the file is created
  // Straight into the file, without the archive in memory first (a buffer of the checkpoint's size,
  // whose fresh pages alone cost a large save about a second).
  write_file_atomically(path, [&](const ByteSink& sink) {
    // A failed write (a full disk) must not throw through the zip writer's C code, and its
    // destructor would write again: the first error is kept, the rest of the archive dropped, and
    // the error thrown once the writer is done (the temporary file is then removed).
    std::exception_ptr failure;
    write_archive(
        plain, [](size_t) {},
        [&](const char* data, size_t size) {
          if (failure) return;
          try {
            sink(data, size);
          } catch (...) {
            failure = std::current_exception();
          }
        });
    if (failure) std::rethrow_exception(failure);
  });
}

void write_file_atomically(const std::string& path, const std::function<void(const ByteSink& sink)>& produce) {
  const fs::path target(path);
  fs::path directory = target.parent_path();
  if (directory.empty()) directory = ".";
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec) throw_io_error("create directory", directory.string(), path, ec.value());

  // Same directory as the target, so the rename stays on one file system and is atomic; the pid
  // keeps processes that save the same path from writing into one temporary file.
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io_error("create", tmp, path, errno);
  try {
    produce([&](const char* data, size_t size) { write_all(fd, data, size, tmp, path); });
    // Data must be on disk before the rename makes it visible, or a crash could leave `path`
    // naming an empty file.
    if (::fsync(fd) != 0) throw_io_error("fsync", tmp, path, errno);
    if (::close(fd) != 0) {
      ::unlink(tmp.c_str());
      throw_io_error("close", tmp, path, errno);
    }
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    ::unlink(tmp.c_str());
    throw_io_error("rename", tmp, path, rename_errno);
  }
  // The rename itself lives in the directory: without this fsync a crash could forget it.
  fsync_directory(directory, path);
}

c10::IValue load_checkpoint_file(const std::string& path) {
  const std::string what = fmt::format("checkpoint file '{}'", path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    throw CheckpointError(
        fmt::format("{} is missing (no such file). HINT: check the path, or point ckpt_path at an existing "
                    "checkpoint",
                    what));
  }
  if (fs::is_directory(status)) {
    throw CheckpointError(
        fmt::format("{} is a directory, expected a checkpoint file. HINT: point ckpt_path at a file inside "
                    "it",
                    what));
  }
  const auto size = fs::file_size(path, ec);
  if (!ec && size == 0) {
    throw CheckpointError(
        fmt::format("{} is empty (0 bytes), expected a torch.save zip archive. {}", what, kRecoveryHint));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw CheckpointError(
        fmt::format("{} cannot be opened: {}. HINT: check its permissions", what, std::strerror(errno)));
  }
  char head[sizeof(kZipMagic)] = {};
  in.read(head, sizeof(head));
  const auto head_size = static_cast<size_t>(in.gcount());
  if (head_size < sizeof(kZipMagic) || !std::equal(std::begin(kZipMagic), std::end(kZipMagic), head)) {
    throw CheckpointError(describe_bad_magic(head, head_size, what));
  }
  in.close();
  // The reader reads records from the file as needed, so a large checkpoint is not held in
  // memory twice.
  return open_and_read([&] { return std::make_unique<caffe2::serialize::PyTorchStreamReader>(path); }, what);
}

void CheckpointIO::save_bytes(const std::vector<char>& bytes, const std::string& path) {
  save(load_from_bytes(bytes, path), path);
}

void TorchCheckpointIO::save(const c10::IValue& checkpoint, const std::string& path) {
  save_checkpoint_file(checkpoint, path);
}

void TorchCheckpointIO::save_bytes(const std::vector<char>& bytes, const std::string& path) {
  write_file_atomically(path, [&](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

c10::IValue TorchCheckpointIO::load(const std::string& path) { return load_checkpoint_file(path); }

void TorchCheckpointIO::remove(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) {
    throw CheckpointError(fmt::format(
        "could not remove checkpoint '{}': {}. HINT: check the permissions of its directory", path, ec.message()));
  }
}

bool TorchCheckpointIO::exists(const std::string& path) const {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

std::vector<std::string> TorchCheckpointIO::list(const std::string& prefix) const {
  const fs::path start(prefix);
  const fs::path dir = start.has_parent_path() ? start.parent_path() : fs::path(".");
  const std::string name = start.filename().string();
  std::vector<std::string> result;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, fs::directory_options::skip_permission_denied, ec)) {
    if (entry.is_regular_file(ec) && entry.path().filename().string().rfind(name, 0) == 0)
      result.push_back((dir / entry.path().filename()).string());
  }
  std::sort(result.begin(), result.end());
  return result;
}

void InMemoryCheckpointIO::save(const c10::IValue& checkpoint, const std::string& path) {
  std::vector<char> bytes = save_to_bytes(checkpoint);
  const std::lock_guard<std::mutex> lock(mutex_);
  files_[path] = std::move(bytes);
}

void InMemoryCheckpointIO::save_bytes(const std::vector<char>& bytes, const std::string& path) {
  const std::lock_guard<std::mutex> lock(mutex_);
  files_[path] = bytes;
}

c10::IValue InMemoryCheckpointIO::load(const std::string& path) {
  std::vector<char> bytes;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = files_.find(path);
    if (it == files_.end()) {
      throw CheckpointError(
          fmt::format("checkpoint '{}' is missing (in memory; stored: [{}]). HINT: save it first, or load "
                      "one of the stored paths",
                      path, fmt::join(paths_locked(), ", ")));
    }
    bytes = it->second;
  }
  return load_from_bytes(bytes, fmt::format("checkpoint '{}' (in memory)", path));
}

void InMemoryCheckpointIO::remove(const std::string& path) {
  const std::lock_guard<std::mutex> lock(mutex_);
  files_.erase(path);
}

bool InMemoryCheckpointIO::exists(const std::string& path) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return files_.count(path) > 0;
}

std::vector<std::string> InMemoryCheckpointIO::list(const std::string& prefix) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> result;
  for (auto it = files_.lower_bound(prefix); it != files_.end() && it->first.rfind(prefix, 0) == 0; ++it)
    result.push_back(it->first);
  return result;
}

std::vector<std::string> InMemoryCheckpointIO::paths() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return paths_locked();
}

std::vector<std::string> InMemoryCheckpointIO::paths_locked() const {
  std::vector<std::string> result;
  result.reserve(files_.size());
  for (const auto& entry : files_) result.push_back(entry.first);
  return result;
}

}  // namespace volt
