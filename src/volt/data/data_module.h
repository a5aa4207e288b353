// Data apart from the model: Lightning's LightningDataModule.
//
// A DataModule holds everything about a data set (where it comes from, how it is split, how it
// is loaded) so that one module trains on several data sets, and one data set feeds several
// modules, with the same Trainer calls: trainer.fit(model, data), trainer.test(model, data).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "volt/data/data_loader.h"

namespace volt {

/// What a Trainer call is doing, for DataModule::setup and teardown (Lightning's `stage`).
enum class Stage { kFit, kValidate, kTest, kPredict };
/// "fit", "validate", "test" or "predict" (Lightning's strings).
const char* to_string(Stage stage);
/// The Stage named `text`; throws volt::Error listing the names there are.
Stage parse_stage(const std::string& text);

/// The data of a run, given to Trainer::fit, validate, test and predict beside the module.
///
/// Order per Trainer call: prepare_data (once per node, see below), setup(stage) on every
/// process, the stage's *_dataloader methods, the stage, teardown(stage) (also when the stage
/// fails). A loader it does not provide (undefined) falls back to the module's hook.
class DataModule {
 public:
  virtual ~DataModule() = default;
  /// Downloads, unpacks or writes the data to disk. Runs on one process per node (local rank 0)
  /// while the node's other processes wait, so it must not set state that the others need:
  /// that is setup's job.
  virtual void prepare_data() {}
  /// Whether prepare_data runs once per node (true: each node has its own disk) or once in the
  /// whole run, on global rank 0 (false: a file system the nodes share).
  virtual bool prepare_data_per_node() const { return true; }
  /// Builds the data sets `stage` needs (splits, transforms); runs on every process.
  virtual void setup(Stage stage) {}
  /// Releases what setup built once `stage` has ended; runs on every process.
  virtual void teardown(Stage stage) {}
  /// The training data (undefined: the module's train_dataloader).
  virtual DataLoader train_dataloader() { return {}; }
  /// The validation data (undefined: the module's val_dataloader).
  virtual DataLoader val_dataloader() { return {}; }
  /// The test data (undefined: the module's test_dataloader).
  virtual DataLoader test_dataloader() { return {}; }
  /// The prediction data (undefined: the module's predict_dataloader).
  virtual DataLoader predict_dataloader() { return {}; }
  /// Several validation loaders (see LightningModule::val_dataloaders); the default is
  /// val_dataloader() alone, none when it is undefined (then the module's are used).
  virtual std::vector<DataLoader> val_dataloaders();
  /// Several test loaders; the default is test_dataloader() alone.
  virtual std::vector<DataLoader> test_dataloaders();
};

/// Whether the process at `local_rank` (on its node) and `global_rank` (in the run) calls
/// data.prepare_data(): local rank 0 of every node when data.prepare_data_per_node(), otherwise
/// global rank 0 alone.
bool runs_prepare_data(const DataModule& data, int64_t local_rank, int64_t global_rank);

}  // namespace volt
