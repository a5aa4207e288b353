#include "volt/precision/precision.h"

#include <gtest/gtest.h>

#include "volt/base/torch_version.h"
#include "volt/core/error.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

TEST(Precision, NamesRoundTrip) {
  for (Precision p : {Precision::k32True, Precision::k64True, Precision::k16Mixed, Precision::kBf16Mixed,
                      Precision::k16True, Precision::kBf16True}) {
    EXPECT_EQ(parse_precision(to_string(p)), p) << to_string(p);
  }
}

TEST(Precision, ShortAliasesAreLightnings) {
  EXPECT_EQ(parse_precision("32"), Precision::k32True);
  EXPECT_EQ(parse_precision("64"), Precision::k64True);
  EXPECT_EQ(parse_precision("16"), Precision::k16Mixed);
  EXPECT_EQ(parse_precision("bf16"), Precision::kBf16Mixed);
  EXPECT_EQ(parse_precision(" BF16-Mixed "), Precision::kBf16Mixed);
}

TEST(Precision, UnknownNameListsEveryMode) {
  const std::string message = testing::error_message([] { parse_precision("8-mixed"); });
  EXPECT_NE(message.find("precision='8-mixed'"), std::string::npos) << message;
  for (const char* name : {"'32-true'", "'64-true'", "'16-mixed'", "'bf16-mixed'", "'16-true'", "'bf16-true'"}) {
    EXPECT_NE(message.find(name), std::string::npos) << name << " in " << message;
  }
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST(Precision, OnlyMixedModesAreMixed) {
  EXPECT_TRUE(is_mixed(Precision::k16Mixed));
  EXPECT_TRUE(is_mixed(Precision::kBf16Mixed));
  EXPECT_FALSE(is_mixed(Precision::kBf16True));
  EXPECT_FALSE(is_mixed(Precision::k32True));
}

TEST(Precision, CudaRunsEveryMode) {
  EXPECT_EQ(supported_precisions(c10::DeviceType::CUDA).size(), 6u);
  EXPECT_NO_THROW(check_precision_supported(Precision::k16Mixed, c10::DeviceType::CUDA));
}

TEST(Precision, CpuRunsBf16MixedAndTrue) {
  EXPECT_NO_THROW(check_precision_supported(Precision::kBf16Mixed, c10::DeviceType::CPU));
  EXPECT_NO_THROW(check_precision_supported(Precision::kBf16True, c10::DeviceType::CPU));
  EXPECT_NO_THROW(check_precision_supported(Precision::k64True, c10::DeviceType::CPU));
}

#if !VOLT_TORCH_CPU_FLOAT16
TEST(Precision, Float16OnCpuNamesTheBf16Alternative) {
  const std::string mixed =
      testing::error_message([] { check_precision_supported(Precision::k16Mixed, c10::DeviceType::CPU); });
  EXPECT_NE(mixed.find("precision='16-mixed'"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("'bf16-mixed'"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("'32-true'"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("HINT: use precision='bf16-mixed'"), std::string::npos) << mixed;
  const std::string pure =
      testing::error_message([] { check_precision_supported(Precision::k16True, c10::DeviceType::CPU); });
  EXPECT_NE(pure.find("HINT: use precision='bf16-true'"), std::string::npos) << pure;
}
#endif

TEST(Precision, AMissingHalfPrecisionKernelGetsAHintAndOtherErrorsNone) {
  // LibTorch 1.13's words for mse_loss on bfloat16 CPU tensors.
  const auto hint = missing_kernel_hint("(LibTorch) \"mse_cpu\" not implemented for 'BFloat16'");
  ASSERT_TRUE(hint.has_value());
  EXPECT_NE(hint->find("HINT: this LibTorch has no BFloat16 kernel"), std::string::npos) << *hint;
  EXPECT_NE(hint->find("volt::AutocastStateGuard"), std::string::npos) << *hint;
  EXPECT_NE(hint->find("bf16 precision"), std::string::npos) << *hint;
  EXPECT_NE(missing_kernel_hint("\"addmm_impl_cpu_\" not implemented for 'Half'")->find("no Half kernel"),
            std::string::npos);
  EXPECT_FALSE(missing_kernel_hint("shape '[2, 3]' is invalid for input of size 5").has_value());
}

}  // namespace
}  // namespace volt
