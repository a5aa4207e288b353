// volt::metrics: metrics accumulated over batches and synced across processes (torchmetrics'
// core). See docs/metrics.md.
#pragma once

#include "volt/core/error.h"  // VOLT_CHECK, for the input checks of metrics written by users
#include "volt/metrics/accuracy.h"
#include "volt/metrics/auroc.h"
#include "volt/metrics/confusion_matrix.h"
#include "volt/metrics/mean_squared_error.h"
#include "volt/metrics/metric.h"
#include "volt/metrics/precision_recall.h"
#include "volt/metrics/stat_scores.h"
