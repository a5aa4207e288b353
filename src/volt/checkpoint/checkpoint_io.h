// Checkpoint files: the bytes of a `torch.save` zip archive, written atomically.
//
// A checkpoint is one c10::IValue holding only plain values — dicts (string or int keys), lists,
// tuples, strings, ints, doubles, bools, None — and tensors. It is written in the zip format
// Python's `torch.save` writes ("archive/data.pkl" plus one "archive/data/<n>" record per
// storage), and its pickle references no global beyond those Python's own torch.save of such a
// dict references (`torch._utils._rebuild_tensor_v2`, storage types such as `torch.FloatStorage`,
// `collections.OrderedDict`). So Python reads it with `torch.load(path, weights_only=True)`, and
// C++ reads what Python's torch.save wrote.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace volt {

/// Serializes `value` into the bytes of a torch.save zip archive ("archive/data.pkl" + tensor
/// records). Tensors are saved detached, contiguous and from CPU.
///
/// Throws volt::InternalError naming the key path (e.g. `["state_dict"]["w"]`) of the first
/// value that is not plain, before anything is written.
std::vector<char> save_to_bytes(const c10::IValue& value);

/// save_to_bytes into `archive`, replacing what it held and reusing its memory: a writer that
/// serializes one snapshot after another into the same buffer writes into pages already there
/// instead of a fresh buffer's (for 1.6 GB, about a second of page faults; bench/checkpoint_write.cpp).
void save_to_bytes(const c10::IValue& value, std::vector<char>& archive);

/// Parses the bytes of a torch.save zip archive (ours or Python's torch.save). Tensors load on
/// CPU; dicts and lists load as generic (`Any`-typed) containers. `what` names the source in
/// errors, e.g. a path.
///
/// Throws volt::CheckpointError when the bytes are empty, not a zip archive, or miss a record.
c10::IValue load_from_bytes(const std::vector<char>& bytes, const std::string& what = "checkpoint");

/// Writes `value` to `path` atomically (see write_file_atomically).
void save_checkpoint_file(const c10::IValue& value, const std::string& path);

/// Appends `size` bytes at `data` to the file being written; see write_file_atomically.
using ByteSink = std::function<void(const char* data, size_t size)>;

/// Writes the file `path` atomically: `produce` hands its bytes, in order, to the sink it is given,
/// which writes them into `<path>.tmp.<pid>` in the same directory; then the file is fsynced,
/// renamed over `path`, and the directory fsynced. Creates parent directories. A reader sees either
/// the old file or the new one, never a half-written one; when `produce` (or a write) throws, the
/// temporary file is removed and `path` is left as it was. How every checkpoint file is written
/// (torch.save archives, safetensors files, their indexes).
///
/// Throws volt::CheckpointError naming `path` and the step that failed (create, write, fsync, rename).
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink& sink)>& produce);

/// Reads the checkpoint file at `path`.
///
/// Throws volt::CheckpointError naming the path and what is wrong (missing, empty, truncated or
/// corrupt) with a HINT of what to do.
c10::IValue load_checkpoint_file(const std::string& path);

/// How checkpoints are stored: TorchCheckpointIO by default, another one through
/// Trainer::set_checkpoint_io (tests use InMemoryCheckpointIO).
class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;

  /// Stores `checkpoint` under `path`, replacing what was there.
  virtual void save(const c10::IValue& checkpoint, const std::string& path) = 0;

  /// Stores a checkpoint already serialized (save_to_bytes) under `path`: a snapshot serialized
  /// once for its memory tier and its file. The default parses the bytes and calls save.
  virtual void save_bytes(const std::vector<char>& bytes, const std::string& path);

  /// Loads the checkpoint stored under `path`; throws volt::CheckpointError if it can't.
  virtual c10::IValue load(const std::string& path) = 0;

  /// Removes the checkpoint under `path`; removing one that does not exist does nothing.
  virtual void remove(const std::string& path) = 0;

  /// Whether a checkpoint is stored under `path`.
  virtual bool exists(const std::string& path) const = 0;

  /// The stored paths that begin with `prefix`, sorted: how a sharded checkpoint's stale shard
  /// files are found and removed. The default lists none, so an IO without it leaves them behind.
  virtual std::vector<std::string> list(const std::string& prefix) const { return {}; }
};

/// Checkpoints as files, written atomically by save_checkpoint_file.
class TorchCheckpointIO : public CheckpointIO {
 public:
  /// Writes `checkpoint` to the file `path` (see save_checkpoint_file).
  void save(const c10::IValue& checkpoint, const std::string& path) override;

  /// Writes `bytes` to the file `path` atomically, as they are.
  void save_bytes(const std::vector<char>& bytes, const std::string& path) override;

  /// Reads the file `path` (see load_checkpoint_file).
  c10::IValue load(const std::string& path) override;

  /// Deletes the file `path`, if there is one.
  void remove(const std::string& path) override;

  /// Whether the file `path` exists.
  bool exists(const std::string& path) const override;

  /// The files in `prefix`'s directory whose paths begin with `prefix` (no recursion).
  std::vector<std::string> list(const std::string& prefix) const override;
};

/// Checkpoints kept as bytes in memory, for tests of code that saves checkpoints. It serializes
/// like TorchCheckpointIO, so what a test loads went through the real format.
class InMemoryCheckpointIO : public CheckpointIO {
 public:
  /// Serializes `checkpoint` and keeps its bytes under `path`.
  void save(const c10::IValue& checkpoint, const std::string& path) override;

  /// Keeps `bytes` under `path`.
  void save_bytes(const std::vector<char>& bytes, const std::string& path) override;

  /// Parses the bytes kept under `path`; throws volt::CheckpointError if there are none.
  c10::IValue load(const std::string& path) override;

  /// Forgets the bytes under `path`, if any.
  void remove(const std::string& path) override;

  /// Whether bytes are kept under `path`.
  bool exists(const std::string& path) const override;

  /// The kept paths that begin with `prefix`.
  std::vector<std::string> list(const std::string& prefix) const override;

  /// The paths with a stored checkpoint, sorted.
  std::vector<std::string> paths() const;

 private:
  std::vector<std::string> paths_locked() const;

  mutable std::mutex mutex_;
  std::map<std::string, std::vector<char>> files_;
};

}  // namespace volt
