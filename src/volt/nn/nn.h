// Volt's layers: everything in volt::nn.
#pragma once

#include "volt/nn/sync_batch_norm.h"
