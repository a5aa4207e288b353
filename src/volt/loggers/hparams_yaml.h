// Hyperparameters as Lightning's `hparams.yaml`, readable by Python's `yaml.safe_load`.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace volt {

/// `params` as a YAML document that `yaml.safe_load` reads back as the same Python value.
///
/// Objects become maps, arrays sequences, null `~`. Strings that PyYAML would read as another
/// type ("true", "1e-3", "") are quoted, and floats always carry a '.' so they stay floats.
std::string to_hparams_yaml(const nlohmann::json& params);

/// Writes `to_hparams_yaml(params)` to the file `path`, replacing it.
void save_hparams_to_yaml(const std::string& path, const nlohmann::json& params);

}  // namespace volt
