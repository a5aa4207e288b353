// Volt's layers: everything in volt::nn.
#pragma once

#include "volt/nn/activation_checkpoint.h"
#include "volt/nn/attention.h"
#include "volt/nn/sync_batch_norm.h"
