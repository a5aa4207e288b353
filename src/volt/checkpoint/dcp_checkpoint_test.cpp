// DcpCheckpoint's refusals. Reading what PyTorch 2.x's dcp.save writes (FSDP at world sizes 2 and
// 4, model and optimizer) is tested against PyTorch itself: tests/interop/test_dcp_interop.py.
#include "volt/checkpoint/dcp_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "volt/checkpoint/plain_unpickler.h"
#include "volt/core/error.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

class DcpCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("volt-dcp-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string error_opening() const {
    try {
      DcpCheckpoint::open(dir_.string());
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(DcpCheckpointTest, AFolderWithoutMetadataIsNamedWithWhatToGiveInstead) {
  std::string message = error_opening();
  EXPECT_NE(message.find("has no .metadata"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT: give the folder dcp.save wrote"), std::string::npos) << message;
  // The Hugging Face layout (what `volt checkpoint to-dcp` writes) is another reader's.
  std::ofstream(dir_ / "model.safetensors") << "x";
  message = error_opening();
  EXPECT_NE(message.find("holds .safetensors files"), std::string::npos) << message;
}

TEST_F(DcpCheckpointTest, AMetadataThatReferencesAnyOtherGlobalIsRefusedWithoutRunningIt) {
  // protocol 2: os.system("true") -- what a hostile .metadata would do under pickle.load.
  using namespace std::string_literals;  // NOLINT: the pickle holds NUL bytes
  const std::string pickle =
      "\x80\x02"
      "cos\nsystem\nX\x04\x00\x00\x00true\x85R."s;
  std::ofstream(dir_ / ".metadata", std::ios::binary) << pickle;
  const std::string message = error_opening();
  EXPECT_NE(message.find("references the global `os.system`"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(DcpMetadataUnpickler, RecordsDtypesSizesAndIndexKeysLoadAsPlainValues) {
  // A ChunkStorageMetadata record built as PyTorch pickles a dataclass, in a dict keyed by a
  // MetadataIndex: {MetadataIndex(fqn="w", offset=torch.Size([2, 0])): ChunkStorageMetadata(...)}.
  using namespace std::string_literals;  // NOLINT: the pickles hold NUL bytes
  const std::string g = "ctorch.distributed.checkpoint.metadata\n"s;
  std::string p = "\x80\x02}("s;  // PROTO 2, EMPTY_DICT, MARK
  // (A hex escape takes every hex digit after it: "\x00" "fqn" keeps the f out of it.)
  p += g +
       "MetadataIndex\n)\x81}(X\x03\x00\x00\x00"
       "fqnX\x01\x00\x00\x00"
       "wX\x06\x00\x00\x00"
       "offset"s;
  p += "ctorch\nSize\nK\x02K\x00\x86\x85Rub"s;
  p += g +
       "ChunkStorageMetadata\n)\x81}(X\x05\x00\x00\x00"
       "dtypectorch\nfloat32\nub"s;
  p += "u."s;
  const c10::IValue value = internal::unpickle_dcp_metadata(p.data(), p.size(), "test");
  const c10::impl::GenericDict dict = value.toGenericDict();
  ASSERT_TRUE(dict.contains("w@2,0"));
  const c10::impl::GenericDict record = dict.at("w@2,0").toGenericDict();
  EXPECT_EQ(record.at("__class__").toStringRef(), "ChunkStorageMetadata");
  EXPECT_EQ(record.at("dtype").toStringRef(), "float32");
}

}  // namespace
}  // namespace volt
