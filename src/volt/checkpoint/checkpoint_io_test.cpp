#include "volt/checkpoint/checkpoint_io.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint64_t bits_of(double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double double_from_bits(uint64_t bits) {
  double value = 0;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Compares what was saved with what was loaded: same structure, exact doubles (bit for bit),
// equal tensors of the same dtype and shape. Containers may differ in static type (we save typed
// lists, we load generic ones), so only the contents are compared.
void expect_same(const c10::IValue& expected, const c10::IValue& actual, const std::string& path) {
  SCOPED_TRACE(path.empty() ? "<root>" : path);
  if (expected.isTensor()) {
    ASSERT_TRUE(actual.isTensor()) << actual.tagKind();
    const at::Tensor e = expected.toTensor();
    const at::Tensor a = actual.toTensor();
    EXPECT_EQ(e.scalar_type(), a.scalar_type());
    EXPECT_EQ(e.sizes(), a.sizes());
    EXPECT_TRUE(a.device().is_cpu());
    EXPECT_TRUE(torch::equal(e.cpu(), a));
    return;
  }
  if (expected.isDouble()) {
    ASSERT_TRUE(actual.isDouble()) << actual.tagKind();
    EXPECT_EQ(bits_of(expected.toDouble()), bits_of(actual.toDouble()));
    return;
  }
  if (expected.isList()) {
    ASSERT_TRUE(actual.isList()) << actual.tagKind();
    const auto e = expected.toList();
    const auto a = actual.toList();
    ASSERT_EQ(e.size(), a.size());
    for (size_t i = 0; i < e.size(); ++i) {
      expect_same(e.get(i), a.get(i), fmt::format("{}[{}]", path, i));
    }
    return;
  }
  if (expected.isTuple()) {
    ASSERT_TRUE(actual.isTuple()) << actual.tagKind();
    const auto& e = expected.toTupleRef().elements();
    const auto& a = actual.toTupleRef().elements();
    ASSERT_EQ(e.size(), a.size());
    for (size_t i = 0; i < e.size(); ++i) {
      expect_same(e[i], a[i], fmt::format("{}[{}]", path, i));
    }
    return;
  }
  if (expected.isGenericDict()) {
    ASSERT_TRUE(actual.isGenericDict()) << actual.tagKind();
    const auto e = expected.toGenericDict();
    const auto a = actual.toGenericDict();
    ASSERT_EQ(e.size(), a.size());
    auto a_it = a.begin();
    for (const auto& entry : e) {
      // Insertion order survives the round trip, as in a Python dict.
      EXPECT_EQ(entry.key(), a_it->key());
      ASSERT_TRUE(a.contains(entry.key())) << entry.key();
      expect_same(entry.value(), a.at(entry.key()), fmt::format("{}[{}]", path, c10::str(entry.key())));
      ++a_it;
    }
    return;
  }
  EXPECT_EQ(expected.tagKind(), actual.tagKind());
  EXPECT_EQ(expected, actual);
}

c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// A checkpoint with every plain kind of value, nested.
c10::IValue every_plain_value() {
  torch::manual_seed(0);
  auto tensors = string_dict();
  tensors.insert("float", torch::randn({3, 4}));
  tensors.insert("double", torch::randn({2, 2}, torch::kFloat64));
  tensors.insert("int64", torch::arange(-5, 5, torch::kInt64));
  tensors.insert("uint8", torch::arange(0, 256, torch::kInt64).to(torch::kUInt8));
  tensors.insert("bool", torch::tensor({true, false, true}));
  tensors.insert("scalar", torch::tensor(3.5));
  tensors.insert("empty", torch::empty({0, 3}));
  // A transposed view: non-contiguous, sharing its base's storage.
  tensors.insert("transposed_view", torch::arange(12, torch::kFloat32).reshape({3, 4}).t());
  tensors.insert("sliced_view", torch::arange(100, torch::kFloat64).slice(0, 10, 40, 3));

  auto numbers = string_dict();
  numbers.insert("zero", int64_t{0});
  numbers.insert("negative", int64_t{-7});
  numbers.insert("int64_max", std::numeric_limits<int64_t>::max());
  numbers.insert("int64_min", std::numeric_limits<int64_t>::min());
  numbers.insert("big", int64_t{1} << 40);
  numbers.insert("tenth", 0.1);
  numbers.insert("negative_zero", -0.0);
  numbers.insert("denormal", std::numeric_limits<double>::denorm_min());
  numbers.insert("infinity", std::numeric_limits<double>::infinity());
  numbers.insert("odd_bits", double_from_bits(0x3ff0000000000001ULL));

  c10::impl::GenericList mixed(c10::AnyType::get());
  mixed.push_back(int64_t{1});
  mixed.push_back("two");
  mixed.push_back(3.0);
  mixed.push_back(c10::IValue());
  mixed.push_back(torch::ones({2}));
  c10::impl::GenericList inner(c10::AnyType::get());
  inner.push_back(false);
  mixed.push_back(inner);

  auto root = string_dict();
  root.insert("epoch", int64_t{3});
  root.insert("name", "ckpt \"quoted\" ünïcödé");
  root.insert("empty_string", "");
  root.insert("flag", true);
  root.insert("off", false);
  root.insert("nothing", c10::IValue());
  root.insert("tensors", tensors);
  root.insert("numbers", numbers);
  root.insert("mixed", mixed);
  root.insert("typed_ints", c10::List<int64_t>({1, 2, 3}));
  root.insert("typed_doubles", c10::List<double>({0.5, 0.25}));
  root.insert("typed_tensors", c10::List<at::Tensor>({torch::zeros({1}), torch::ones({2})}));
  c10::Dict<std::string, int64_t> typed_dict;
  typed_dict.insert("a", 1);
  typed_dict.insert("b", 2);
  root.insert("typed_dict", typed_dict);
  root.insert("tuple", c10::ivalue::Tuple::create({c10::IValue(0.9), c10::IValue(0.999)}));
  root.insert("empty_dict", string_dict());
  root.insert("empty_list", c10::impl::GenericList(c10::AnyType::get()));
  return root;
}

std::string data_pkl(const std::vector<char>& archive) {
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(archive.data(), static_cast<off_t>(archive.size())));
  auto [data, size] = reader.getRecord("data.pkl");
  return std::string(static_cast<const char*>(data.get()), size);
}

TEST(CheckpointIo, EveryPlainValueSurvivesARoundTripThroughBytes) {
  const c10::IValue value = every_plain_value();
  expect_same(value, load_from_bytes(save_to_bytes(value)), "");
}

TEST(CheckpointIo, EveryPlainValueSurvivesARoundTripThroughAFile) {
  TempDir dir;
  const c10::IValue value = every_plain_value();
  save_checkpoint_file(value, dir.file("a.ckpt"));
  expect_same(value, load_checkpoint_file(dir.file("a.ckpt")), "");
}

TEST(CheckpointIo, ArchiveHasTheRecordNamesTorchSaveWrites) {
  auto root = string_dict();
  root.insert("w", torch::ones({2}));
  root.insert("b", torch::zeros({3}, torch::kFloat64));
  const std::vector<char> archive = save_to_bytes(root);
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(archive.data(), static_cast<off_t>(archive.size())));
  EXPECT_TRUE(reader.hasRecord("data.pkl"));
  EXPECT_TRUE(reader.hasRecord("data/0"));
  EXPECT_TRUE(reader.hasRecord("data/1"));
  EXPECT_TRUE(reader.hasRecord("version"));
  // The records sit under the archive name torch.save uses for buffers.
  const std::string head(archive.data(), std::min<size_t>(archive.size(), 64));
  EXPECT_NE(head.find("archive/"), std::string::npos) << head;
}

TEST(CheckpointIo, TheArchiveIsBuiltInTheOneBufferReservedForIt) {
  // A buffer that grew by doubling would end up to twice the archive's size (and would have copied
  // it over and over): the reserve must cover the tensors and the zip records' overhead at once.
  auto root = string_dict();
  for (int i = 0; i < 20; ++i) root.insert("t" + std::to_string(i), torch::rand({65536}));
  const std::vector<char> archive = save_to_bytes(root);
  EXPECT_GE(archive.capacity(), archive.size());
  EXPECT_LE(archive.capacity() - archive.size(), (20u + 8u) * 512u) << archive.size() << " bytes";
  expect_same(root, load_from_bytes(archive), "");
}

TEST(CheckpointIo, SerializingIntoABufferReusesItsMemoryAndReplacesWhatItHeld) {
  auto root = string_dict();
  for (int i = 0; i < 4; ++i) root.insert("t" + std::to_string(i), torch::rand({4096}));
  std::vector<char> buffer;
  save_to_bytes(root, buffer);
  const char* memory = buffer.data();
  EXPECT_EQ(buffer, save_to_bytes(root));

  root.insert_or_assign("t0", torch::zeros({4096}));  // the next snapshot: same shapes, new values
  save_to_bytes(root, buffer);
  EXPECT_EQ(buffer.data(), memory) << "written into the same pages";
  EXPECT_EQ(buffer, save_to_bytes(root)) << "what it held before is gone";
  expect_same(root, load_from_bytes(buffer), "");
}

TEST(CheckpointIo, PickleReferencesNoTorchScriptGlobals) {
  // Typed containers are what pickle_save tags with torch.jit._pickle globals; ours must not.
  const std::string pickle = data_pkl(save_to_bytes(every_plain_value()));
  EXPECT_EQ(pickle.find("torch.jit"), std::string::npos);
  EXPECT_EQ(pickle.find("restore_type_tag"), std::string::npos);
  EXPECT_EQ(pickle.find("build_intlist"), std::string::npos);
  EXPECT_NE(pickle.find("_rebuild_tensor_v2"), std::string::npos);
}

TEST(CheckpointIo, AViewIsSavedWithoutItsBaseStorage) {
  auto root = string_dict();
  const at::Tensor big = torch::zeros({1 << 20});
  root.insert("view", big.slice(0, 10, 20));
  const std::vector<char> archive = save_to_bytes(root);
  EXPECT_LT(archive.size(), 16u * 1024u) << "the 4 MiB base storage was written";
  expect_same(root, load_from_bytes(archive), "");
}

TEST(CheckpointIo, TensorsThatRequireGradAreSavedDetached) {
  auto root = string_dict();
  root.insert("p", torch::ones({2}, torch::requires_grad()));
  const c10::IValue loaded = load_from_bytes(save_to_bytes(root));
  const at::Tensor p = loaded.toGenericDict().at("p").toTensor();
  EXPECT_FALSE(p.requires_grad());
  EXPECT_TRUE(torch::equal(p, torch::ones({2})));
}

TEST(CheckpointIo, IntKeyedDictsSurviveARoundTrip) {
  // The layout of torch.optim state: {param index: {...}}.
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  auto first = string_dict();
  first.insert("step", int64_t{4});
  first.insert("exp_avg", torch::full({2}, 0.5));
  state.insert(int64_t{0}, first);
  state.insert(int64_t{7}, string_dict());
  auto root = string_dict();
  root.insert("state", state);
  expect_same(root, load_from_bytes(save_to_bytes(root)), "");
}

TEST(CheckpointIo, AValueThatIsNotPlainThrowsNamingItsKeyPath) {
  auto inner = string_dict();
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(int64_t{1});
  list.push_back(c10::Device(c10::kCPU));
  inner.insert("devices", list);
  auto root = string_dict();
  root.insert("loops", inner);
  try {
    save_to_bytes(root);
    FAIL() << "expected volt::InternalError";
  } catch (const InternalError& error) {
    EXPECT_NE(std::string(error.what()).find(R"(["loops"]["devices"][1])"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("Device"), std::string::npos) << error.what();
  }
}

TEST(CheckpointIo, AnUndefinedTensorIsNotPlain) {
  auto root = string_dict();
  root.insert("t", at::Tensor());
  EXPECT_THROW(save_to_bytes(root), InternalError);
}

TEST(CheckpointIo, SaveLeavesNoTemporaryFilesAndCreatesParentDirectories) {
  TempDir dir;
  const std::string path = (dir.path() / "nested" / "deeper" / "last.ckpt").string();
  auto root = string_dict();
  root.insert("epoch", int64_t{1});
  save_checkpoint_file(root, path);
  root.insert_or_assign("epoch", int64_t{2});
  save_checkpoint_file(root, path);  // Overwrites.

  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::path(path).parent_path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"last.ckpt"});
  EXPECT_EQ(load_checkpoint_file(path).toGenericDict().at("epoch").toInt(), 2);
}

TEST(CheckpointIo, AFailedSaveLeavesTheOldFileUntouched) {
  TempDir dir;
  const std::string path = dir.file("last.ckpt");
  auto good = string_dict();
  good.insert("epoch", int64_t{1});
  save_checkpoint_file(good, path);
  const std::vector<char> before = read_bytes(path);

  auto bad = string_dict();
  bad.insert("epoch", int64_t{2});
  bad.insert("device", c10::Device(c10::kCPU));
  EXPECT_THROW(save_checkpoint_file(bad, path), InternalError);

  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

// A file-size limit stops a save at a fixed point inside its write, deterministically (a SIGKILL
// from outside would race the write's end): with SIGXFSZ's default action the writer dies there, a
// crash mid-write; with SIGXFSZ ignored, write() fails with EFBIG, as on a full disk with ENOSPC.
constexpr rlim_t kFileSizeLimit = 64 * 1024;

/// How a forked save under kFileSizeLimit ended: the child and its wait status. The child exits
/// 0 when the save completed, 3 on a CheckpointError naming the failed write and the system's
/// reason, 4 on another CheckpointError, 2 on any other exception.
struct LimitedSave {
  pid_t child = -1;
  int status = 0;
};

/// Saves a 1 MiB checkpoint over `path` in a child process under kFileSizeLimit, SIGXFSZ set to
/// `on_limit`; no core file.
LimitedSave save_under_file_size_limit(const std::string& path, sighandler_t on_limit) {
  // Made before fork: the child runs no tensor kernels (OpenMP's pool does not survive fork).
  auto large = string_dict();
  large.insert("weights", torch::ones({256 * 1024}));  // 1 MiB
  LimitedSave save;
  save.child = ::fork();
  if (save.child == 0) {
    const rlimit no_core{0, 0};
    const rlimit fsize{kFileSizeLimit, kFileSizeLimit};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    ::signal(SIGXFSZ, on_limit);
    try {
      save_checkpoint_file(large, path);
    } catch (const CheckpointError& error) {
      const std::string what = error.what();  // "... write '<tmp>' failed: File too large. HINT: ..."
      const bool names_the_write = what.find(": write '") != std::string::npos;
      ::_exit(names_the_write && what.find(std::strerror(EFBIG)) != std::string::npos ? 3 : 4);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  if (save.child > 0) ::waitpid(save.child, &save.status, 0);
  return save;
}

/// Saves a small checkpoint at `path` and returns its bytes: what a failed save must leave.
std::vector<char> save_previous_checkpoint(const std::string& path) {
  auto old = string_dict();
  old.insert("weights", torch::arange(1000, torch::kFloat));
  save_checkpoint_file(old, path);
  return read_bytes(path);
}

TEST(CheckpointIo, AWriterKilledMidWriteLeavesThePreviousFileIntact) {
  TempDir dir;
  const std::string path = dir.file("last.ckpt");
  const std::vector<char> before = save_previous_checkpoint(path);

  const LimitedSave save = save_under_file_size_limit(path, SIG_DFL);
  ASSERT_GT(save.child, 0) << std::strerror(errno);
  ASSERT_TRUE(WIFSIGNALED(save.status)) << "the writer was not killed mid-write (exit status "
                                        << WEXITSTATUS(save.status) << ")";
  EXPECT_EQ(WTERMSIG(save.status), SIGXFSZ);

  EXPECT_EQ(read_bytes(path), before);
  EXPECT_TRUE(torch::equal(load_checkpoint_file(path).toGenericDict().at("weights").toTensor(),
                           torch::arange(1000, torch::kFloat)));
  // The half-written file is the temporary one, which no search for *.ckpt takes for a checkpoint.
  const fs::path tmp = fmt::format("{}.tmp.{}", path, save.child);
  ASSERT_TRUE(fs::exists(tmp));
  EXPECT_EQ(fs::file_size(tmp), kFileSizeLimit);
  EXPECT_NE(tmp.extension().string(), ".ckpt");
}

TEST(CheckpointIo, AFullDiskFailsTheSaveWithAnErrorAndLeavesThePreviousFile) {
  // save_checkpoint_file streams the archive into the file: a write that fails half-way must come
  // back as a CheckpointError, not end the process inside the zip writer.
  TempDir dir;
  const std::string path = dir.file("last.ckpt");
  const std::vector<char> before = save_previous_checkpoint(path);

  const LimitedSave save = save_under_file_size_limit(path, SIG_IGN);
  ASSERT_GT(save.child, 0) << std::strerror(errno);
  ASSERT_TRUE(WIFEXITED(save.status)) << "the writer died of signal " << WTERMSIG(save.status);
  EXPECT_EQ(WEXITSTATUS(save.status), 3)
      << "0: the save succeeded; 2: another exception; 4: the message names no failed write";
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1)
      << "a temporary file is left";
}

// Runs `load` and returns the CheckpointError's message, or fails the test.
template <typename Load>
std::string checkpoint_error_of(Load load) {
  try {
    load();
  } catch (const CheckpointError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected volt::CheckpointError";
  return "";
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "missing \"" << part << "\" in: " << message;
}

TEST(CheckpointIo, ATruncatedFileThrowsCheckpointErrorNamingThePath) {
  TempDir dir;
  const std::string good = dir.file("good.ckpt");
  save_checkpoint_file(every_plain_value(), good);
  const std::vector<char> bytes = read_bytes(good);
  for (size_t keep : {bytes.size() - 1, bytes.size() - 30, bytes.size() / 2, size_t{10}}) {
    SCOPED_TRACE(fmt::format("kept {} of {} bytes", keep, bytes.size()));
    const std::string path = dir.file(fmt::format("cut_{}.ckpt", keep));
    write_bytes(path, std::vector<char>(bytes.begin(), bytes.begin() + keep));
    const std::string message = checkpoint_error_of([&] { load_checkpoint_file(path); });
    expect_contains(message, path);
    expect_contains(message, "truncated or corrupt");
    expect_contains(message, "HINT:");
  }
}

TEST(CheckpointIo, AnArchiveWithoutItsTensorRecordThrowsCheckpointError) {
  // A zip that is whole but lacks data/0: rewrite the archive with only data.pkl and version.
  auto root = string_dict();
  root.insert("w", torch::ones({2}));
  const std::vector<char> archive = save_to_bytes(root);
  const std::string pickle = data_pkl(archive);
  std::vector<char> broken;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      broken.insert(broken.end(), static_cast<const char*>(data), static_cast<const char*>(data) + size);
      return size;
    });
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeEndOfFile();
  }
  const std::string message = checkpoint_error_of([&] { load_from_bytes(broken, "thing"); });
  expect_contains(message, "thing");
  expect_contains(message, "a record is missing");
}

TEST(CheckpointIo, AGarbageFileThrowsCheckpointErrorSayingItIsNotAZipArchive) {
  TempDir dir;
  const std::string path = dir.file("garbage.ckpt");
  write_bytes(path, {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
  const std::string message = checkpoint_error_of([&] { load_checkpoint_file(path); });
  expect_contains(message, path);
  expect_contains(message, "not a zip archive");
  expect_contains(message, "HINT:");
}

TEST(CheckpointIo, AnEmptyFileThrowsCheckpointErrorSayingItIsEmpty) {
  TempDir dir;
  const std::string path = dir.file("empty.ckpt");
  write_bytes(path, {});
  const std::string message = checkpoint_error_of([&] { load_checkpoint_file(path); });
  expect_contains(message, path);
  expect_contains(message, "empty");
  expect_contains(message, "HINT:");
}

TEST(CheckpointIo, AMissingFileThrowsCheckpointErrorSayingItIsMissing) {
  TempDir dir;
  const std::string path = dir.file("nope.ckpt");
  const std::string message = checkpoint_error_of([&] { load_checkpoint_file(path); });
  expect_contains(message, path);
  expect_contains(message, "missing");
  expect_contains(message, "HINT:");
}

TEST(CheckpointIo, ADirectoryIsNotACheckpointFile) {
  TempDir dir;
  const std::string message = checkpoint_error_of([&] { load_checkpoint_file(dir.path()); });
  expect_contains(message, "is a directory");
}

TEST(CheckpointIo, EmptyBytesThrowCheckpointErrorNamingWhatTheyAre) {
  const std::string message = checkpoint_error_of([&] { load_from_bytes({}, "upload #3"); });
  expect_contains(message, "upload #3");
  expect_contains(message, "empty");
}

TEST(TorchCheckpointIo, SavesLoadsRemovesAndReportsExistence) {
  TempDir dir;
  TorchCheckpointIO io;
  const std::string path = dir.file("x.ckpt");
  EXPECT_FALSE(io.exists(path));
  auto root = string_dict();
  root.insert("global_step", int64_t{10});
  io.save(root, path);
  EXPECT_TRUE(io.exists(path));
  EXPECT_EQ(io.load(path).toGenericDict().at("global_step").toInt(), 10);
  io.remove(path);
  EXPECT_FALSE(io.exists(path));
  io.remove(path);  // Removing twice is fine.
  EXPECT_THROW(io.load(path), CheckpointError);
}

TEST(InMemoryCheckpointIo, KeepsCheckpointsByPathThroughTheRealFormat) {
  InMemoryCheckpointIO io;
  EXPECT_TRUE(io.paths().empty());
  const c10::IValue value = every_plain_value();
  io.save(value, "ckpts/b.ckpt");
  io.save(value, "ckpts/a.ckpt");
  EXPECT_EQ(io.paths(), (std::vector<std::string>{"ckpts/a.ckpt", "ckpts/b.ckpt"}));
  EXPECT_TRUE(io.exists("ckpts/a.ckpt"));
  EXPECT_FALSE(io.exists("ckpts/c.ckpt"));
  expect_same(value, io.load("ckpts/a.ckpt"), "");

  io.remove("ckpts/a.ckpt");
  io.remove("ckpts/never-saved.ckpt");
  EXPECT_EQ(io.paths(), std::vector<std::string>{"ckpts/b.ckpt"});
  const std::string message = checkpoint_error_of([&] { io.load("ckpts/a.ckpt"); });
  expect_contains(message, "ckpts/a.ckpt");
  expect_contains(message, "ckpts/b.ckpt");
}

TEST(InMemoryCheckpointIo, RejectsAValueThatIsNotPlainLikeTheFileIo) {
  InMemoryCheckpointIO io;
  auto root = string_dict();
  root.insert("device", c10::Device(c10::kCPU));
  EXPECT_THROW(io.save(root, "x.ckpt"), InternalError);
  EXPECT_FALSE(io.exists("x.ckpt"));
}

}  // namespace
}  // namespace volt
