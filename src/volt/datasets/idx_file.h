// Reading IDX files, the format of MNIST and its drop-in replacements (Fashion-MNIST, KMNIST).
#pragma once

#include <torch/types.h>

#include <string>

namespace volt::datasets {

/// Reads an IDX file, gzip-compressed or plain, into a uint8 tensor of the shape its header
/// declares (e.g. [60000, 28, 28] for MNIST's training images, [60000] for its labels).
///
/// The format: two zero bytes, a type code (0x08 = unsigned byte, the only one supported), the
/// number of dimensions, each dimension as a big-endian uint32, then the data. Throws
/// volt::Error naming the file when it is missing, is not an IDX file, holds another type, or
/// holds less or more data than its header declares.
torch::Tensor read_idx_file(const std::string& path);

}  // namespace volt::datasets
