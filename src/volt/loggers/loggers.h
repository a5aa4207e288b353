// Volt's loggers: include this to get all of them.
#pragma once

#include "volt/loggers/csv_logger.h"
#include "volt/loggers/hparams_yaml.h"
#include "volt/loggers/logger.h"
#include "volt/loggers/mlflow_logger.h"
#include "volt/loggers/tensorboard_logger.h"
