#include "volt/options/cli_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <vector>

#include "volt/core/edit_distance.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/loggers/hparams_yaml.h"

namespace volt {
namespace {

using nlohmann::json;

/// CLI11's group for options that name none: their keys are top-level.
constexpr const char* kDefaultGroup = "Options";

std::string replace_all(std::string text, char from, char to) {
  std::replace(text.begin(), text.end(), from, to);
  return text;
}

bool is_flag(const CLI::Option& option) { return option.get_expected_min() == 0; }

/// The words a flag takes besides being given bare (`--deterministic=warn`): those its type name
/// lists, separated by '|'; empty for a plain true/false flag (whose type name is empty).
std::vector<std::string> flag_words(const CLI::Option& option) {
  if (!is_flag(option) || option.get_type_name().empty()) return {};
  return split(option.get_type_name(), '|');
}

/// A word flag's value as YAML writes it: true and false as booleans, other words as text.
json word_value(const std::string& text) {
  bool value = false;
  if (CLI::detail::lexical_cast(text, value)) return value;
  return text;
}

/// CLI11's type name without the validators' descriptions ("INT:{1,2}" -> "INT").
std::string base_type(const CLI::Option& option) {
  const std::string type = option.get_type_name();
  return type.substr(0, type.find(':'));
}

/// The long name a key is written with: the first one that is not a negation (`!--no-x`).
std::string primary_long_name(const CLI::Option& option) {
  const auto& negated = option.get_fnames();
  for (const std::string& name : option.get_lnames()) {
    if (std::find(negated.begin(), negated.end(), name) == negated.end()) return name;
  }
  return "";
}

/// A float written as to_hparams_yaml writes it ("1.0", "0.25", "1.0e-05"), so that text which
/// already reads like that can become a number without changing when printed and read back.
std::string yaml_float_text(double value) {
  std::string text = fmt::format("{}", value);
  const auto exponent = text.find('e');
  const std::string mantissa = text.substr(0, exponent);
  if (mantissa.find('.') == std::string::npos)
    text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  return text;
}

/// `text`, an option's value, as the JSON value a reader of the config expects: numbers for
/// numeric options (and for text options whose value reads exactly like a number, such as
/// `limit_train_batches: 0.25`), null for an empty non-text value.
json typed_value(const CLI::Option& option, const std::string& text) {
  const std::string type = base_type(option);
  if (text.empty()) return type == "TEXT" ? json("") : json(nullptr);
  if (type == "BOOLEAN") {
    bool value = false;
    if (CLI::detail::lexical_cast(text, value)) return value;
    return text;
  }
  const auto integer = parse_int(text);
  if (type == "INT" && integer) return static_cast<int64_t>(*integer);
  if (type == "UINT" && integer && *integer >= 0) return static_cast<uint64_t>(*integer);
  const auto number = parse_double(text);
  if (type == "FLOAT" && number) return *number;
  if (integer && std::to_string(*integer) == text) return static_cast<int64_t>(*integer);
  if (number && yaml_float_text(*number) == text) return *number;
  return text;
}

/// The resolved value of one option: what the command line or the file gave, else the bound
/// variable's current value (the program's default), else the default string.
json resolved_value(CLI::Option& option) {
  if (option.count() == 0) option.capture_default_str();
  const std::string fallback = option.get_default_str();
  if (!flag_words(option).empty()) {
    const std::string text = option.count() > 0 ? option.as<std::string>() : fallback;
    // Empty: a tri-state flag left unset (tune_allocator); null reads back as unset, not as false.
    return text.empty() ? json(nullptr) : word_value(text);
  }
  if (is_flag(option)) {
    if (option.count() > 0) return option.as<bool>();
    bool value = false;
    if (fallback.empty() || !CLI::detail::lexical_cast(fallback, value)) return false;
    return value;
  }
  if (option.get_items_expected_max() > 1) {
    json list = json::array();
    if (option.count() == 0 && fallback.empty()) return list;
    for (const std::string& item : option.as<std::vector<std::string>>()) list.push_back(typed_value(option, item));
    return list;
  }
  return typed_value(option, option.count() > 0 ? option.as<std::string>() : fallback);
}

/// One configurable option as a config file sees it.
struct ConfigEntry {
  CLI::Option* option = nullptr;
  std::string section;  ///< "" for a top-level key.
  std::string key;      ///< The key --print-config writes.
};

/// Reads one YAML document into CLI11's ConfigItems, checking every key and value against the
/// app's options first, so that mistakes are reported with the file and the key rather than
/// as a flag the user never typed.
class ConfigReader {
 public:
  ConfigReader(CLI::App& app, std::string file)
      : file_(std::move(file)),
        program_(app.get_name()),
        skip_unknown_(app.get_allow_config_extras() == CLI::config_extras_mode::ignore_all) {
    if (program_.empty()) program_ = "the program";
    for (CLI::Option* option : app.get_options()) {
      const std::string key = config_key(*option);
      if (key.empty()) continue;
      entries_.push_back({option, config_section(*option), key});
      if (!entries_.back().section.empty()) sections_.insert(entries_.back().section);
    }
  }

  std::vector<CLI::ConfigItem> read(const YAML::Node& root) {
    if (root.IsNull()) return {};
    VOLT_CHECK(
        root.IsMap(),
        "config file '{}' holds a {} at the top; expected sections and keys such as `trainer: {{max_epochs: 3}}`. "
        "HINT: `{} --print-config` prints a complete config to start from.",
        file_, node_kind(root), program_);
    for (const auto& pair : root) {
      const std::string name = key_text(pair.first, "");
      if (pair.second.IsMap()) {
        read_section(name, pair.second);
      } else {
        read_value("", name, pair.second);
      }
    }
    return std::move(items_);
  }

 private:
  static const char* node_kind(const YAML::Node& node) {
    if (node.IsMap()) return "mapping";
    if (node.IsSequence()) return "list";
    if (node.IsScalar()) return "single value";
    return "null";
  }

  std::string key_text(const YAML::Node& key, const std::string& section) const {
    VOLT_CHECK(key.IsScalar(),
               "config file '{}' has a {} as a key{}; expected a name. HINT: keys are option names "
               "such as max_epochs.",
               file_, node_kind(key), section.empty() ? "" : " under '" + section + ":'");
    return key.Scalar();
  }

  static std::string path(const std::string& section, const std::string& key) {
    return section.empty() ? key : section + "." + key;
  }

  std::string hint() const {
    return fmt::format("HINT: `{} --print-config` prints every key in its section with its current value.", program_);
  }

  /// The entry whose long names include `key` (with `_` or `-`), and whether `key` is a negation.
  std::pair<const ConfigEntry*, bool> find(const std::string& key) const {
    const std::string dashed = replace_all(key, '_', '-');
    for (const ConfigEntry& entry : entries_) {
      const auto& names = entry.option->get_lnames();
      if (std::find(names.begin(), names.end(), dashed) == names.end()) continue;
      const auto& negated = entry.option->get_fnames();
      return {&entry, std::find(negated.begin(), negated.end(), dashed) != negated.end()};
    }
    return {nullptr, false};
  }

  std::vector<std::string> keys_in(const std::string& section) const {
    std::vector<std::string> keys;
    for (const ConfigEntry& entry : entries_) {
      if (entry.section == section) keys.push_back(entry.key);
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  void read_section(const std::string& section, const YAML::Node& node) {
    if (sections_.count(section) == 0 && skip_unknown_ && find(section).first == nullptr) return;
    if (sections_.count(section) == 0) {
      if (find(section).first != nullptr) {
        throw Error(fmt::format("config file '{}': '{}' takes a value, not a mapping. {}", file_, section, hint()));
      }
      const std::vector<std::string> names(sections_.begin(), sections_.end());
      const std::string guess = closest_name(section, names);
      throw Error(fmt::format("config file '{}': unknown section '{}:'{}. Sections: {}; top-level keys: {}. {}", file_,
                              section, guess.empty() ? "" : fmt::format(" (did you mean '{}:'?)", guess),
                              join(names, ", "), join(keys_in(""), ", "), hint()));
    }
    for (const auto& pair : node) read_value(section, key_text(pair.first, section), pair.second);
  }

  void read_value(const std::string& section, const std::string& key, const YAML::Node& node) {
    const auto [entry, negated] = find(key);
    if (entry == nullptr && skip_unknown_) return;
    if (entry == nullptr) unknown_key(section, key);
    if (entry->section != section) {
      throw Error(fmt::format(
          "config file '{}': '{}' is {} key, but it is {}. HINT: move it to {} (`{} --print-config` shows where "
          "every key goes).",
          file_, key, entry->section.empty() ? "a top-level" : "a '" + entry->section + ":'",
          section.empty() ? "at the top level" : "under '" + section + ":'",
          entry->section.empty() ? "the top level" : "'" + entry->section + ":'", program_));
    }
    const std::string where = path(section, key);
    const auto [previous, inserted] = given_.emplace(entry->option, where);
    VOLT_CHECK(inserted, "config file '{}' sets {} twice: as '{}' and as '{}'. HINT: keep one of them.", file_,
               path(entry->section, entry->key), previous->second, where);
    // null (or nothing after the colon) keeps the program's default, as --print-config writes it
    // for options without a value.
    if (node.IsNull()) return;
    VOLT_CHECK(!node.IsMap(), "config file '{}': {} is a mapping; expected {}. {}", file_, where,
               expected(*entry->option), hint());
    std::vector<std::string> inputs;
    if (node.IsScalar()) inputs.push_back(node.Scalar());
    for (const YAML::Node& item : node) {
      if (!node.IsSequence()) break;
      VOLT_CHECK(item.IsScalar(), "config file '{}': {} holds a nested {}; expected a list of values. {}", file_, where,
                 node_kind(item), hint());
      inputs.push_back(item.Scalar());
    }
    // A list for an option that takes one value is written as the flag would take it: "0,1".
    if (node.IsSequence() && entry->option->get_items_expected_max() <= 1) inputs = {join(inputs, ",")};
    if (is_flag(*entry->option)) {
      VOLT_CHECK(inputs.size() == 1, "config file '{}': {} is a list; expected true or false. {}", file_, where,
                 hint());
      inputs = {flag_words(*entry->option).empty() ? flag_text(where, inputs.front(), negated)
                                                   : word_text(*entry->option, where, inputs.front())};
    } else {
      for (std::string& input : inputs) check_value(*entry->option, where, input);
    }
    items_.push_back(CLI::ConfigItem{{}, primary_long_name(*entry->option), std::move(inputs)});
  }

  [[noreturn]] void unknown_key(const std::string& section, const std::string& key) const {
    const std::vector<std::string> accepted = keys_in(section);
    std::string guess = closest_name(replace_all(key, '-', '_'), accepted);
    if (guess.empty()) {
      // A typo of a key that lives in another section.
      for (const ConfigEntry& entry : entries_) {
        if (edit_distance(replace_all(key, '-', '_'), entry.key) <= std::max<size_t>(2, key.size() / 3)) {
          guess = path(entry.section, entry.key);
          break;
        }
      }
    } else {
      guess = path(section, guess);
    }
    throw Error(fmt::format("config file '{}': unknown key '{}'{}. {} keys: {}. {}", file_, path(section, key),
                            guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess),
                            section.empty() ? std::string("Top-level") : "'" + section + ":'",
                            accepted.empty() ? "(none)" : join(accepted, ", "), hint()));
  }

  static std::string expected(const CLI::Option& option) {
    if (const std::vector<std::string> words = flag_words(option); !words.empty()) return "one of " + join(words, ", ");
    if (is_flag(option)) return "true or false";
    const std::string type = base_type(option);
    if (type == "INT") return "an integer";
    if (type == "UINT") return "an integer >= 0";
    if (type == "FLOAT") return "a number";
    if (type == "BOOLEAN") return "true or false";
    return "a value";
  }

  std::string flag_text(const std::string& where, const std::string& text, bool negated) const {
    const std::optional<bool> value = parse_switch_word(text);
    VOLT_CHECK(value.has_value(),
               "config file '{}': {}='{}' is not a boolean; expected true or false. HINT: write `{}: true`.", file_,
               where, text, where.substr(where.rfind('.') + 1));
    return *value != negated ? "true" : "false";
  }

  /// `text` as one of the words the word flag `option` takes (true and false also in the
  /// spellings flag_text accepts); anything else is an error naming the file, key and words.
  std::string word_text(const CLI::Option& option, const std::string& where, const std::string& text) const {
    const std::vector<std::string> words = flag_words(option);
    std::string word = to_lower(trim(text));
    if (std::find(words.begin(), words.end(), word) != words.end()) return word;
    const bool has_booleans = std::find(words.begin(), words.end(), "true") != words.end();
    if (const std::optional<bool> value = parse_switch_word(word); has_booleans && value) {
      return *value ? "true" : "false";
    }
    throw Error(fmt::format("config file '{}': {}='{}' is not supported; expected one of {}. HINT: write `{}: {}`.",
                            file_, where, text, join(words, ", "), where.substr(where.rfind('.') + 1), words.front()));
  }

  /// Converts and validates `input` as the option will, so a bad value names the file and key.
  void check_value(CLI::Option& option, const std::string& where, std::string& input) const {
    const std::string type = base_type(option);
    bool converts = true;
    if (type == "INT") {
      int64_t value = 0;
      converts = CLI::detail::lexical_cast(input, value);
    } else if (type == "UINT") {
      uint64_t value = 0;
      converts = CLI::detail::lexical_cast(input, value);
    } else if (type == "FLOAT") {
      double value = 0;
      converts = CLI::detail::lexical_cast(input, value);
    } else if (type == "BOOLEAN") {
      bool value = false;
      converts = CLI::detail::lexical_cast(input, value);
    }
    VOLT_CHECK(converts, "config file '{}': {}='{}' is not {} ({} takes {}). {}", file_, where, input, expected(option),
               option.get_name(), type, hint());
    for (int index = 0;; ++index) {
      CLI::Validator* validator = nullptr;
      try {
        validator = option.get_validator(index);
      } catch (const CLI::OptionNotFound&) {
        break;
      }
      std::string value = input;
      std::string problem;
      try {
        problem = (*validator)(value);
      } catch (const CLI::ValidationError& e) {
        problem = e.what();
      } catch (const Error& e) {
        problem = e.what();
      }
      VOLT_CHECK(problem.empty(), "config file '{}': {}='{}' is not accepted: {}", file_, where, input, problem);
    }
  }

  std::string file_;
  std::string program_;
  /// True when the app reads only part of the config (CLI::config_extras_mode::ignore_all): the
  /// `volt` tool reads a program's trainer section and leaves the program's own keys to it.
  bool skip_unknown_ = false;
  std::vector<ConfigEntry> entries_;
  std::set<std::string> sections_;
  std::map<const CLI::Option*, std::string> given_;
  std::vector<CLI::ConfigItem> items_;
};

/// CLI11's config formatter for YAML: CLI11 then applies the items only to options the command
/// line did not set, which gives "flags override the file" for every option of the program.
class YamlConfig : public CLI::Config {
 public:
  explicit YamlConfig(CLI::App* app) : app_(app) {}

  std::string to_config(const CLI::App*, bool, bool, std::string) const override {
    return to_hparams_yaml(resolved_config(*app_));
  }

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    const std::string file = app_->get_config_ptr()->as<std::string>();
    const std::string text((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw Error(
          fmt::format("config file '{}' is not valid YAML: {} (line {}, column {}). HINT: `{} --print-config` "
                      "prints a valid config to start from.",
                      file, e.msg, e.mark.line + 1, e.mark.column + 1,
                      app_->get_name().empty() ? "the program" : app_->get_name()));
    }
    return ConfigReader(*app_, file).read(root);
  }

 private:
  CLI::App* app_;
};

void print_config_and_exit(CLI::App& app) {
  // Convert and validate what was given before printing it, as parsing would right after.
  for (CLI::Option* option : app.get_options()) {
    if (option->count() > 0 && !option->get_callback_run()) option->run_callback();
  }
  std::cout << to_hparams_yaml(resolved_config(app)) << std::flush;
  throw CLI::Success();
}

}  // namespace

std::string config_key(const CLI::Option& option) {
  if (!option.get_configurable()) return "";
  const std::string name = primary_long_name(option);
  if (name.empty() || name == "help" || name == "help-all") return "";
  return replace_all(name, '-', '_');
}

std::string config_section(const CLI::Option& option) {
  const std::string& group = option.get_group();
  if (group.empty() || group == kDefaultGroup) return "";
  return replace_all(to_lower(group), ' ', '_');
}

void add_config_flags(CLI::App& app) {
  if (app.get_option_no_throw("--print-config") != nullptr) return;
  app.config_formatter(std::make_shared<YamlConfig>(&app));
  app.set_config("--config", "", "read options from a YAML file (trainer:, model:, data: sections; flags override it)")
      ->check(CLI::ExistingFile)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->group(kDefaultGroup);
  app.add_flag_callback(
         "--print-config", [&app] { print_config_and_exit(app); },
         "print the resolved configuration (defaults, --config file, flags) as YAML and exit")
      ->configurable(false)
      ->group(kDefaultGroup);
}

std::optional<bool> parse_switch_word(const std::string& text) {
  const std::string word = to_lower(trim(text));
  if (word == "true" || word == "yes" || word == "on" || word == "1") return true;
  if (word == "false" || word == "no" || word == "off" || word == "0") return false;
  return std::nullopt;
}

json resolved_config(CLI::App& app) {
  json config = json::object();
  for (CLI::Option* option : app.get_options()) {
    const std::string key = config_key(*option);
    if (key.empty()) continue;
    const std::string section = config_section(*option);
    // A section and a top-level key of the same name, or two options with one key, would make
    // the file ambiguous: a mistake in the program, reported to its author.
    json& target = section.empty() ? config : config[section];
    VOLT_CHECK(target.is_null() || target.is_object(),
               "{}: the config section '{}:' has the name of a top-level option. HINT: put --{} in a group, or "
               "rename the group.",
               app.get_name(), section, section);
    VOLT_CHECK(!target.contains(key),
               "{}: two options (or an option and a section) share the config key '{}'. HINT: give one of them "
               "another long name or group.",
               app.get_name(), key);
    target[key] = resolved_value(*option);
  }
  return config;
}

}  // namespace volt
