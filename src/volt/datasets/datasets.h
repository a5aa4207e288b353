// Volt's built-in data sets.
#pragma once

#include "volt/datasets/fashion_mnist.h"
#include "volt/datasets/idx_file.h"
#include "volt/datasets/image_folder.h"
#include "volt/datasets/npy_shards.h"
#include "volt/datasets/token_windows.h"
#include "volt/datasets/transforms.h"
