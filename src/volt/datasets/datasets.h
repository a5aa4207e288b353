// Volt's built-in data sets.
#pragma once

#include "volt/datasets/fashion_mnist.h"
#include "volt/datasets/idx_file.h"
