#include "volt/callbacks/on_exception_checkpoint.h"

#include <filesystem>

#include "volt/core/error.h"

namespace volt {

OnExceptionCheckpoint::OnExceptionCheckpoint(OnExceptionCheckpointOptions options) : options_(std::move(options)) {
  VOLT_CHECK(!options_.dirpath.empty(),
             "OnExceptionCheckpoint needs a dirpath (none was given). HINT: pass the folder to save into, e.g. "
             "OnExceptionCheckpoint({{.dirpath = \"checkpoints\"}}).");
  VOLT_CHECK(!options_.filename.empty(),
             "OnExceptionCheckpoint(filename=''): the file name is empty. HINT: leave it unset for "
             "\"on_exception\", or name the file without \".ckpt\".");
}

std::string OnExceptionCheckpoint::checkpoint_path() const {
  return (std::filesystem::path(options_.dirpath) / (options_.filename + ".ckpt")).string();
}

void OnExceptionCheckpoint::on_exception(const CallbackContext& context, const std::exception&,
                                         CallbackServices& services) {
  // Only fit has a run to save (its context carries the optimizers).
  if (context.optimizers == nullptr) return;
  services.save_checkpoint(checkpoint_path());
}

}  // namespace volt
