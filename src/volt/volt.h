// Volt's umbrella header: everything a training program needs.
#pragma once

// LibTorch's whole C++ API (torch::nn, torch::optim, ...): a module file needs nothing else. In
// this build the precompiled header hid that it was missing; installed users have no PCH.
#include <torch/torch.h>

#include "volt/callbacks/early_stopping.h"
#include "volt/callbacks/finetuning.h"
#include "volt/callbacks/gradient_accumulation_scheduler.h"
#include "volt/callbacks/lr_monitor.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/monitors.h"
#include "volt/callbacks/on_exception_checkpoint.h"
#include "volt/callbacks/timer.h"
#include "volt/callbacks/weight_averaging.h"
#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/checkpoint_state.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/checkpoint/weight_source.h"
#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"
#include "volt/datasets/image_folder.h"
#include "volt/datasets/npy_shards.h"
#include "volt/datasets/token_windows.h"
#include "volt/loggers/csv_logger.h"
#include "volt/loggers/mlflow_logger.h"
#include "volt/loggers/tensorboard_logger.h"
#include "volt/metrics/metrics.h"
#include "volt/module/lightning_module.h"
#include "volt/nn/nn.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/pipeline/balance.h"
#include "volt/pipeline/pipe.h"
#include "volt/pipeline/pipeline.h"
#include "volt/precision/precision_plugin.h"
#include "volt/strategies/fsdp_unit.h"
#include "volt/trainer/trainer.h"
#include "volt/tuner/tuner.h"
