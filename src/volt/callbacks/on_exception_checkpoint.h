// Lightning's OnExceptionCheckpoint: a checkpoint of the run when fit fails.
#pragma once

#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

/// Options of OnExceptionCheckpoint.
///
/// Example: `OnExceptionCheckpoint({.dirpath = "checkpoints"})`.
struct OnExceptionCheckpointOptions {
  /// The checkpoint's folder (required, as in Lightning).
  std::string dirpath;
  /// Its file name without ".ckpt" (Lightning's default "on_exception").
  std::string filename = "on_exception";
};

/// Saves a full checkpoint to `<dirpath>/<filename>.ckpt` when fit throws (a failed step, a
/// failing data worker, another process's failure under ddp), so a long run loses at most the
/// step that failed: resume with `ckpt_path` set to that file. The checkpoint holds the progress of
/// the last completed step; the weights are as the failure left them (an exception inside
/// optimizer.step() may leave them half-updated, as in Lightning). Under ddp global rank 0
/// writes it, when it sees the failure; validate, test and predict save nothing.
class OnExceptionCheckpoint : public Callback {
 public:
  /// Throws volt::Error for an empty dirpath or filename.
  explicit OnExceptionCheckpoint(OnExceptionCheckpointOptions options);

  std::string state_key() const override { return "OnExceptionCheckpoint"; }
  void on_exception(const CallbackContext& context, const std::exception& error, CallbackServices& services) override;

  /// Where the checkpoint goes.
  std::string checkpoint_path() const;

 private:
  OnExceptionCheckpointOptions options_;
};

}  // namespace volt
