// Volt's progress reporting: the progress bar and the model summary.
#pragma once

#include "volt/progress/model_summary.h"
#include "volt/progress/progress_bar.h"
