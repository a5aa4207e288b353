// YAML configs (--config, --print-config) moved to volt::options; this header keeps programs
// written before it compiling.
#pragma once

#include "volt/options/cli_config.h"
