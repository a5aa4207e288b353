#include "volt/loggers/hparams_yaml.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {
namespace {

using nlohmann::json;

/// Words that PyYAML's YAML 1.1 resolver reads as a bool or null, or refuses ("=").
bool is_reserved_word(std::string_view text) {
  static constexpr std::string_view kWords[] = {"yes", "no", "true", "false", "on", "off", "null", "~", "=", "<<"};
  const std::string lower = to_lower(text);
  for (std::string_view word : kWords) {
    if (lower == word) return true;
  }
  return false;
}

/// True when a plain scalar `text` would not load back as a string. Anything starting like a
/// number is quoted too: PyYAML 1.1 also reads "1:30" (sexagesimal) and "2024-01-01" (date).
bool needs_quotes(std::string_view text) {
  if (text.empty() || is_reserved_word(text)) return true;
  return std::string_view("0123456789+-.").find(text.front()) != std::string_view::npos;
}

void emit_string(YAML::Emitter& out, const std::string& text) {
  if (needs_quotes(text)) out << YAML::DoubleQuoted;
  out << text;
}

/// A float as PyYAML's float resolver wants it: a '.' in the mantissa and a signed exponent
/// ("1.0e-05", "3.0"); fmt's shortest round-trip form alone gives "1e-05" and "3", which
/// PyYAML would load as a string and an int.
std::string yaml_float(double value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  std::string text = fmt::format("{}", value);
  const auto exponent = text.find('e');
  const std::string_view mantissa = std::string_view(text).substr(0, exponent);
  if (mantissa.find('.') == std::string_view::npos) {
    text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  }
  return text;
}

void emit(YAML::Emitter& out, const json& value) {
  switch (value.type()) {
    case json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [key, item] : value.items()) {
        out << YAML::Key;
        emit_string(out, key);
        out << YAML::Value;
        emit(out, item);
      }
      out << YAML::EndMap;
      return;
    case json::value_t::array:
      out << YAML::BeginSeq;
      for (const auto& item : value) emit(out, item);
      out << YAML::EndSeq;
      return;
    case json::value_t::string:
      emit_string(out, value.get_ref<const std::string&>());
      return;
    case json::value_t::boolean:
      out << value.get<bool>();
      return;
    case json::value_t::number_integer:
      out << value.get<int64_t>();
      return;
    case json::value_t::number_unsigned:
      out << value.get<uint64_t>();
      return;
    case json::value_t::number_float:
      out << yaml_float(value.get<double>());
      return;
    case json::value_t::null:
      out << YAML::Null;
      return;
    case json::value_t::binary:
      VOLT_CHECK(false,
                 "hyperparameters hold a binary value; expected only objects, arrays, strings, "
                 "numbers, booleans and null. HINT: log a string (e.g. a path) instead.");
      return;
    case json::value_t::discarded:
      VOLT_INTERNAL_ASSERT(false, "a discarded JSON value reached the YAML writer");
      return;
  }
}

}  // namespace

std::string to_hparams_yaml(const nlohmann::json& params) {
  YAML::Emitter out;
  emit(out, params);
  VOLT_INTERNAL_ASSERT(out.good(), "yaml-cpp refused the document: {}", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

void save_hparams_to_yaml(const std::string& path, const nlohmann::json& params) {
  const std::string text = to_hparams_yaml(params);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  VOLT_CHECK(file.is_open(),
             "cannot open '{}' for writing: {}. HINT: check that the log "
             "directory is writable.",
             path, std::strerror(errno));
  file << text;
  file.close();
  VOLT_CHECK(!file.fail(), "cannot write '{}': {}. HINT: check free disk space.", path, std::strerror(errno));
}

}  // namespace volt
