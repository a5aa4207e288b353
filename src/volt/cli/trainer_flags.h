// The command line of a Volt program that links LibTorch: the Trainer flags and YAML configs of
// volt::options, and run_main with LibTorch's errors added (volt/cli/run_main.h). One include
// for a program's main; the flags themselves are defined in volt/options/trainer_flags.h.
#pragma once

#include "volt/cli/run_main.h"
#include "volt/options/cli_config.h"
#include "volt/options/trainer_flags.h"
