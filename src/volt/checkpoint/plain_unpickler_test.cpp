#include "volt/checkpoint/plain_unpickler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "volt/core/error.h"

namespace volt::internal {
namespace {

// Pickles below were written by CPython's pickle module (no torch needed), as hex.
std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

c10::IValue unpickle(const std::string& bytes) {
  const ReadRecord no_records = [](const std::string& key) -> std::pair<at::DataPtr, size_t> {
    ADD_FAILURE() << "unexpected record " << key;
    return {at::DataPtr(), 0};
  };
  return unpickle_plain(bytes.data(), bytes.size(), no_records, "test pickle");
}

std::string error_of(const std::string& bytes) {
  try {
    unpickle(bytes);
  } catch (const CheckpointError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected volt::CheckpointError";
  return "";
}

// {"sd": OrderedDict([("b", 1), ("a", -300)]) with a `_metadata` attribute, like a Python
// state_dict, "neg": -2**40, "f": 0.1, "t": (1, "x")}, protocol 2 as torch.save writes.
const char* kStateDictLike =
    "80027d71002858020000007364710163636f6c6c656374696f6e730a4f726465726564446963740a710229527103"
    "2858010000006271044b0158010000006171054ad4feffff757d710658090000005f6d657461646174617107680229"
    "527108580000000071097d710a580700000076657273696f6e710b4b017373736258030000006e6567710c8a0600"
    "00000000ff580100000066710d473fb999999999999a580100000074710e4b01580100000078710f867110752e";

TEST(PlainUnpickler, ReadsAnOrderedDictWithMetadataAsAPlainDictInOrder) {
  const auto root = unpickle(from_hex(kStateDictLike)).toGenericDict();
  const auto sd = root.at("sd").toGenericDict();
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_EQ(sd.begin()->key().toStringRef(), "b");  // Insertion order, not sorted.
  EXPECT_EQ(sd.at("b").toInt(), 1);
  EXPECT_EQ(sd.at("a").toInt(), -300);
  EXPECT_EQ(root.at("neg").toInt(), -(int64_t{1} << 40));
  EXPECT_EQ(root.at("f").toDouble(), 0.1);
  const auto& t = root.at("t").toTupleRef().elements();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].toInt(), 1);
  EXPECT_EQ(t[1].toStringRef(), "x");
}

TEST(PlainUnpickler, ReadsProtocolFourFramesMemoizeAndShortStrings) {
  // {"k": ["é", 2**62, True, None]}, protocol 4.
  const auto root =
      unpickle(from_hex("8004951d000000000000007d948c016b945d94288c02c3a9948a080000000000000040884e65732e"));
  const auto list = root.toGenericDict().at("k").toList();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list.get(0).toStringRef(), "\xc3\xa9");
  EXPECT_EQ(list.get(1).toInt(), int64_t{1} << 62);
  EXPECT_TRUE(list.get(2).toBool());
  EXPECT_TRUE(list.get(3).isNone());
}

TEST(PlainUnpickler, RefusesAGlobalThatIsNotPlainNamingIt) {
  // {"x": fractions.Fraction(1, 3)}
  const std::string message =
      error_of(from_hex("80027d71005801000000787101636672616374696f6e730a4672616374696f6e0a71024b014b038671"
                        "03527104732e"));
  EXPECT_NE(message.find("fractions.Fraction"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(PlainUnpickler, APickleCutShortIsTruncatedOrCorrupt) {
  const std::string whole = from_hex(kStateDictLike);
  for (size_t keep : {size_t{0}, size_t{1}, size_t{9}, whole.size() / 2, whole.size() - 1}) {
    const std::string message = error_of(whole.substr(0, keep));
    EXPECT_NE(message.find("truncated or corrupt"), std::string::npos) << "kept " << keep << ": " << message;
  }
}

TEST(PlainUnpickler, RefusesAnUnknownOpcode) {
  const std::string message = error_of(from_hex("8002ff2e"));
  EXPECT_NE(message.find("opcode 0xff"), std::string::npos) << message;
}

}  // namespace
}  // namespace volt::internal
