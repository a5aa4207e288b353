#include "volt/precision/autocast_guard.h"

#include "volt/precision/autocast_compat.h"

namespace volt {

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype)
    : active_(true),
      device_(device),
      previous_enabled_(compat::autocast_enabled(device)),
      previous_dtype_(compat::autocast_dtype(device)) {
  compat::set_autocast_dtype(device, dtype);
  compat::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // torch.autocast.__exit__: the cache of cast weights lives until the outermost scope ends.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_, previous_enabled_);
  compat::set_autocast_dtype(device_, previous_dtype_);
}

}  // namespace volt
