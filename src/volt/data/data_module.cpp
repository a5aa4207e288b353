#include "volt/data/data_module.h"

#include "volt/core/error.h"

namespace volt {

const char* to_string(Stage stage) {
  switch (stage) {
    case Stage::kFit:
      return "fit";
    case Stage::kValidate:
      return "validate";
    case Stage::kTest:
      return "test";
    case Stage::kPredict:
      return "predict";
  }
  return "?";
}

std::vector<DataLoader> DataModule::val_dataloaders() { return as_loaders(val_dataloader()); }

std::vector<DataLoader> DataModule::test_dataloaders() { return as_loaders(test_dataloader()); }

bool runs_prepare_data(const DataModule& data, int64_t local_rank, int64_t global_rank) {
  return data.prepare_data_per_node() ? local_rank == 0 : global_rank == 0;
}

Stage parse_stage(const std::string& text) {
  for (const Stage stage : {Stage::kFit, Stage::kValidate, Stage::kTest, Stage::kPredict}) {
    if (text == to_string(stage)) return stage;
  }
  throw Error(fmt::format("unknown stage '{}'; expected fit, validate, test or predict.", text));
}

}  // namespace volt
