#include "volt/datasets/image_folder.h"

#include <gtest/gtest.h>
#include <png.h>
#include <torch/torch.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "volt/core/error.h"
#include "volt/data/data_loader.h"

namespace volt::datasets {
namespace {

namespace fs = std::filesystem;

/// Writes `image` (uint8 [C, H, W], C 1 or 3) as a PNG with libpng's writer.
void write_png(const fs::path& path, const torch::Tensor& image) {
  const torch::Tensor hwc = image.permute({1, 2, 0}).contiguous();
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.size(2));
  png.height = static_cast<png_uint_32>(image.size(1));
  png.format = image.size(0) == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  fs::create_directories(path.parent_path());
  ASSERT_NE(png_image_write_to_file(&png, path.c_str(), 0, hwc.data_ptr<uint8_t>(), 0, nullptr), 0) << png.message;
}

/// Writes `image` (uint8 [3, H, W]) as a JPEG of quality 95 with libjpeg-turbo.
void write_jpeg(const fs::path& path, const torch::Tensor& image) {
  const torch::Tensor hwc = image.permute({1, 2, 0}).contiguous();
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(handle, hwc.data_ptr<uint8_t>(), static_cast<int>(image.size(2)), 0,
                        static_cast<int>(image.size(1)), TJPF_RGB, &out, &size, TJSAMP_444, 95, 0),
            0);
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(out), static_cast<std::streamsize>(size));
  tjFree(out);
  tjDestroy(handle);
}

torch::Tensor pattern(int64_t channels, int64_t height, int64_t width, int64_t offset) {
  return (torch::arange(channels * height * width) * 7 + offset)
      .remainder(256)
      .to(torch::kUInt8)
      .view({channels, height, width});
}

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("volt_image_folder_" + std::to_string(getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    // Classes sorted by name: "boot" is label 0, "coat" label 1.
    for (int64_t i = 0; i < 3; ++i) write_png(root_ / "coat" / ("c" + std::to_string(i) + ".png"), pattern(1, 6, 5, i));
    for (int64_t i = 0; i < 2; ++i)
      write_png(root_ / "boot" / ("b" + std::to_string(i) + ".PNG"), pattern(1, 6, 5, 10 + i));
    std::ofstream(root_ / "coat" / "notes.txt") << "not an image";
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_F(ImageFolderTest, PngDecodesExactlyAndJpegClosely) {
  const torch::Tensor rgb = pattern(3, 8, 9, 3);
  write_png(root_ / "x.png", rgb);
  EXPECT_TRUE(torch::equal(decode_image((root_ / "x.png").string()), rgb));
  EXPECT_EQ(decode_image((root_ / "x.png").string(), 1).sizes(), (std::vector<int64_t>{1, 8, 9}));
  EXPECT_TRUE(torch::equal(decode_image((root_ / "coat" / "c1.png").string()), pattern(1, 6, 5, 1)));

  const torch::Tensor smooth = torch::full({3, 16, 16}, 120, torch::kUInt8);
  write_jpeg(root_ / "y.jpg", smooth);
  const torch::Tensor decoded = decode_image((root_ / "y.jpg").string());
  ASSERT_EQ(decoded.sizes(), (std::vector<int64_t>{3, 16, 16}));
  EXPECT_LE((decoded.to(torch::kInt) - 120).abs().max().item<int>(), 2);
}

TEST_F(ImageFolderTest, ListsClassesAndFilesAsTorchvisionDoes) {
  ImageFolder folder(root_.string());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"boot", "coat"}));
  ASSERT_EQ(folder.size(), 5);
  EXPECT_EQ(fs::path(folder.samples()[0].first).filename(), "b0.PNG");
  EXPECT_EQ(folder.samples()[4].second, 1);
  const Example e = folder.get(2);
  EXPECT_EQ(e.target.item<int64_t>(), 1);
  EXPECT_TRUE(torch::allclose(e.data, pattern(1, 6, 5, 0).to(torch::kFloat) / 255));
  const Batch batch = folder.get_batch(torch::tensor({4, 0}));
  EXPECT_EQ(batch.data.sizes(), (std::vector<int64_t>{2, 1, 6, 5}));
  EXPECT_EQ(batch.target[1].item<int64_t>(), 0);
}

TEST_F(ImageFolderTest, ABrokenFileIsNamedOrSkippedAndCountedOnce) {
  std::ofstream(root_ / "coat" / "c1.png", std::ios::binary) << "\x89PNG\r\n\x1a\n truncated";
  const std::string broken = (root_ / "coat" / "c1.png").string();
  ImageFolder strict(root_.string());
  try {
    strict.get_batch(torch::tensor({2, 3}));
    FAIL() << "a damaged file must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot decode PNG '" + broken + "'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("skip_unreadable"), std::string::npos) << e.what();
  }
  ImageFolder lenient(root_.string(), {.skip_unreadable = true});
  EXPECT_EQ(lenient.get_batch(torch::tensor({2, 3, 4})).size(), 2);
  EXPECT_EQ(lenient.get_batch(torch::tensor({3, 0})).size(), 1);
  EXPECT_THROW(lenient.get_batch(torch::tensor({3})), Error) << "a batch of nothing but broken files";
  ASSERT_EQ(lenient.skipped_files().size(), 1u);
  EXPECT_NE(lenient.skipped_files()[0].find(broken), std::string::npos);

  std::ofstream(root_ / "boot" / "b0.PNG") << "GIF89a";
  try {
    decode_image((root_ / "boot" / "b0.PNG").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is neither a PNG nor a JPEG"), std::string::npos) << e.what();
  }
}

TEST_F(ImageFolderTest, MissingOrEmptyFoldersAreClearErrors) {
  EXPECT_THROW(ImageFolder((root_ / "nope").string()), Error);
  try {
    ImageFolder((root_ / "coat").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds no images (0 class folders"), std::string::npos) << e.what();
  }
}

TEST_F(ImageFolderTest, RandomAugmentationsFollowTheSeedEpochAndExampleNotTheWorker) {
  ImageFolderOptions options;
  options.transform = compose({random_crop(4, 4, 1), random_horizontal_flip(0.5)});
  const auto folder = std::make_shared<ImageFolder>(root_.string(), options);
  const auto epoch_of = [&](int64_t workers, int64_t epoch) {
    DataLoader loader(folder, {.batch_size = 2, .shuffle = true, .seed = 9, .num_workers = workers});
    loader.set_epoch(epoch);
    std::vector<torch::Tensor> out;
    BatchStream stream = loader.stream(0, loader.num_batches());
    while (stream.has_next()) out.push_back(stream.next().data);
    return torch::cat(out);
  };
  const torch::Tensor reference = epoch_of(0, 1);
  EXPECT_EQ(reference.sizes(), (std::vector<int64_t>{5, 1, 4, 4}));
  EXPECT_TRUE(torch::equal(epoch_of(3, 1), reference)) << "workers draw the same crops and flips";
  EXPECT_FALSE(torch::equal(epoch_of(0, 2), reference)) << "another epoch, other crops";
}

TEST(Transforms, ShapesValuesAndErrors) {
  at::Generator generator = example_generator(0);
  const torch::Tensor image = torch::arange(2 * 4 * 6, torch::kFloat).view({2, 4, 6});
  EXPECT_EQ(resize(8, 3)(image, generator).sizes(), (std::vector<int64_t>{2, 8, 3}));
  EXPECT_TRUE(torch::equal(center_crop(2, 2)(image, generator), image.narrow(1, 1, 2).narrow(2, 2, 2)));
  EXPECT_TRUE(torch::equal(random_horizontal_flip(1.0)(image, generator), image.flip({2})));
  EXPECT_TRUE(torch::equal(random_horizontal_flip(0.0)(image, generator), image));
  const torch::Tensor normalized = normalize({1, 2}, {2, 4})(image, generator);
  EXPECT_FLOAT_EQ(normalized[1][0][0].item<float>(), (24 - 2) / 4.0f);
  EXPECT_EQ(random_crop(4, 6, 2)(image, generator).sizes(), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_THROW(center_crop(5, 5)(image, generator), Error);
  EXPECT_THROW(normalize({0.5, 0.5, 0.5}, {1, 1, 1})(image, generator), Error);
  EXPECT_THROW(random_horizontal_flip(1.5), Error);
}

}  // namespace
}  // namespace volt::datasets
