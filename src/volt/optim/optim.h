// Volt's optimizer helpers: checkpointable optimizer state and learning-rate schedulers.
#pragma once

#include "volt/optim/lr_scheduler.h"
#include "volt/optim/optimizer_state.h"
