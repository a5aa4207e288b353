// DcpCheckpoint's refusals. Reading what PyTorch 2.x's dcp.save writes (FSDP at world sizes 2 and
// 4, model and optimizer) is tested against PyTorch itself: tests/interop/test_dcp_interop.py.
#include "volt/checkpoint/dcp_checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

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

/// Flattened optimizer entries as dcp.save({"optim": get_optimizer_state_dict(model, optimizer)})
/// writes them (without the "optim." prefix): two groups, listing names out of model order.
std::map<std::string, c10::IValue> two_group_adam() {
  std::map<std::string, c10::IValue> items;
  const auto names = [](std::initializer_list<std::string> list) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const std::string& name : list) out.push_back(name);
    return out;
  };
  items["param_groups.0.params"] = names({"fc2.weight", "fc1.bias"});
  items["param_groups.0.lr"] = 0.01;
  items["param_groups.0.betas"] = c10::ivalue::Tuple::create({c10::IValue(0.9), c10::IValue(0.999)});
  items["param_groups.0.foreach"] = c10::IValue();
  items["param_groups.1.params"] = names({"fc1.weight", "fc2.bias"});
  items["param_groups.1.lr"] = 0.5;
  // fc1.bias has no state (it got no gradient), as PyTorch leaves such a parameter out.
  for (const std::string& name : std::vector<std::string>{"fc2.weight", "fc1.weight", "fc2.bias"}) {
    items["state." + name + ".step"] = at::scalar_tensor(2.0, at::kFloat);
    items["state." + name + ".exp_avg"] = at::full({2}, static_cast<double>(name.size()));
    items["state." + name + ".exp_avg_sq"] = at::ones({2});
  }
  return items;
}

std::string unflatten_error(const std::map<std::string, c10::IValue>& items) {
  try {
    internal::dcp_unflatten_optimizer_state(items, "ckpt");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(DcpOptimizerState, ParametersAreNumberedAcrossGroupsInTheOrderOfTheirNameLists) {
  const c10::impl::GenericDict top = internal::dcp_unflatten_optimizer_state(two_group_adam(), "ckpt").toGenericDict();
  EXPECT_FALSE(top.contains("volt_optimizer"));  // the loader checks the fields instead
  const auto groups = top.at("param_groups").toListRef();
  ASSERT_EQ(groups.size(), 2U);
  EXPECT_EQ(groups[0].toGenericDict().at("params").toIntVector(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(groups[1].toGenericDict().at("params").toIntVector(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(groups[1].toGenericDict().at("lr").toDouble(), 0.5);
  // The other fields PyTorch saved stay, for the loader to read those its optimizer has.
  EXPECT_TRUE(groups[0].toGenericDict().at("betas").isTuple());
  EXPECT_TRUE(groups[0].toGenericDict().contains("foreach"));
  const c10::impl::GenericDict state = top.at("state").toGenericDict();
  ASSERT_EQ(state.size(), 3U);
  EXPECT_FALSE(state.contains(int64_t{1}));  // fc1.bias: no state
  // 0 is fc2.weight (10 characters), 2 fc1.weight, 3 fc2.bias (8).
  EXPECT_EQ(state.at(int64_t{0}).toGenericDict().at("exp_avg").toTensor()[0].item<double>(), 10.0);
  EXPECT_EQ(state.at(int64_t{3}).toGenericDict().at("exp_avg").toTensor()[0].item<double>(), 8.0);
  const at::Tensor step = state.at(int64_t{2}).toGenericDict().at("step").toTensor();
  EXPECT_EQ(step.dim(), 0);
  EXPECT_EQ(step.item<double>(), 2.0);
}

TEST(DcpOptimizerState, APlainStateDictSavedAsItIsKeepsItsNumbers) {
  std::map<std::string, c10::IValue> items;
  items["param_groups.0.params"] = c10::List<int64_t>({0, 1});
  items["param_groups.0.lr"] = 0.1;
  items["state.1.momentum_buffer"] = at::ones({3});
  const c10::impl::GenericDict state =
      internal::dcp_unflatten_optimizer_state(items, "ckpt").toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(state.size(), 1U);
  EXPECT_TRUE(state.contains(int64_t{1}));
}

TEST(DcpOptimizerState, PartsThatDoNotFitTogetherAreNamedWithAHint) {
  std::map<std::string, c10::IValue> items = two_group_adam();
  items["state.fc3.weight.exp_avg"] = at::ones({2});
  std::string message = unflatten_error(items);
  EXPECT_NE(message.find("optimizer state of parameter fc3.weight, which no param group lists"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: save the optimizer as PyTorch's distributed helpers lay it out"), std::string::npos)
      << message;

  items = two_group_adam();
  for (auto it = items.begin(); it != items.end();)
    it = it->first.rfind("param_groups.", 0) == 0 ? items.erase(it) : ++it;
  message = unflatten_error(items);
  EXPECT_NE(message.find("optimizer state of 3 parameter(s) (fc1.weight, ...) but no param_groups"), std::string::npos)
      << message;

  items = two_group_adam();
  items.erase("param_groups.1.params");
  message = unflatten_error(items);
  EXPECT_NE(message.find("param_groups.1 has no 'params' list"), std::string::npos) << message;

  items = two_group_adam();
  items["param_groups.3.lr"] = 0.1;
  message = unflatten_error(items);
  EXPECT_NE(message.find("its param_groups are numbered [0, 1, 3]; expected 0 to 2"), std::string::npos) << message;

  message = unflatten_error({});
  EXPECT_NE(message.find("ckpt: it holds no optimizer state. HINT:"), std::string::npos) << message;
}

TEST_F(DcpCheckpointTest, OnlyAFolderWithMetadataIsADistributedCheckpoint) {
  EXPECT_FALSE(is_dcp_checkpoint(dir_.string()));
  std::ofstream(dir_ / ".metadata") << "x";
  EXPECT_TRUE(is_dcp_checkpoint(dir_.string()));
  EXPECT_FALSE(is_dcp_checkpoint((dir_ / ".metadata").string()));
}

}  // namespace
}  // namespace volt
