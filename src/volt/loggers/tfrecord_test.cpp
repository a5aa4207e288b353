#include "volt/loggers/tfrecord.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "volt/loggers/tfrecord_test_reader.h"

namespace volt::internal {
namespace {

TEST(Crc32c, MatchesTheStandardCheckValue) { EXPECT_EQ(crc32c("123456789"), 0xE3069283u); }

TEST(Crc32c, MatchesRfc3720Vectors) {
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
}

TEST(Crc32c, MaskRotatesRightBy15AndAddsTheDelta) {
  const uint32_t crc = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(FrameTfrecord, LaysOutLengthCrcDataCrc) {
  const std::string record = frame_tfrecord("abc");
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8)) << "little-endian uint64";
  EXPECT_EQ(testing::read_le(record.substr(8, 4)), masked_crc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(testing::read_le(record.substr(15, 4)), masked_crc32c("abc"));
}

TEST(FrameTfrecord, RecordsRoundTripThroughAReaderThatChecksCrcs) {
  const std::string binary("\0\x01\xff\x80zz", 6);
  const std::string file =
      frame_tfrecord("first") + frame_tfrecord("") + frame_tfrecord(binary) + frame_tfrecord(std::string(70000, 'x'));
  const auto records = testing::read_tfrecords(file);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0], "first");
  EXPECT_EQ(records[1], "");
  EXPECT_EQ(records[2], binary);
  EXPECT_EQ(records[3], std::string(70000, 'x'));
}

TEST(FrameTfrecord, AFlippedDataByteFailsTheDataCrc) {
  std::string file = frame_tfrecord("payload");
  file[12] ^= 0x01;
  EXPECT_THROW(testing::read_tfrecords(file), std::runtime_error);
}

}  // namespace
}  // namespace volt::internal
