#pragma once

// Doorman's YAML configurations, read as they are (docs/configuration.md): the binaries'
// `config_options::parse`. The YAML becomes the JSON form the library validates (within
// `yaml_limits`: aliases expanded, at most 100 000 values, 16 MiB, 64 levels), with
// Doorman's forms that have no JSON twin converted: `parameters` as a list of {name, value},
// a numeric algorithm `kind` (0 NO_ALGORITHM, 1 STATIC, 2 PROPORTIONAL_SHARE, 3 FAIR_SHARE).
// Errors name the file, the line and the field. Needs yaml-cpp (DOORMAN_HAVE_YAML); without
// it, a YAML file is refused with a message saying so. The header-only library never includes
// this file.

#include <doorman/core/config.hpp>
#include <doorman/limit/rules.hpp>
#include <doorman/node/access.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>

#ifdef DOORMAN_HAVE_YAML
#include <yaml-cpp/yaml.h>
#endif

namespace doorman_examples {

// Whether `name` (a path, or etcd:KEY) holding `text` is YAML: a path ending in .yml or .yaml;
// for an etcd key, a value that does not start (after blanks) with '{' or a comment.
inline bool is_yaml(std::string_view text, std::string_view name) {
  if (name.ends_with(".yml") || name.ends_with(".yaml")) return true;
  if (!name.starts_with("etcd:")) return false;
  const auto first = text.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && text[first] != '{' && text[first] != '/';
}

#ifdef DOORMAN_HAVE_YAML

/// Bounds on what one YAML document may become (aliases expanded): YAML is read from files,
/// etcd values and rule files, all input from outside. An alias is expanded where it is used,
/// so a chain of aliases a few hundred bytes long could otherwise stand for billions of nodes.
struct yaml_limits {
  static constexpr std::size_t max_nodes = 100'000;           ///< values, aliases expanded
  static constexpr std::size_t max_bytes = 16 * 1024 * 1024;  ///< of keys and scalars, expanded
  static constexpr std::size_t max_depth = 64;                ///< nesting of maps and lists
};

namespace detail {

inline bool valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07u;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // the sequence is cut short
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    constexpr std::uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// YAML -> JSON, remembering the line (from 1) of every field path, within `yaml_limits`.
// Every problem is a `config_error` naming the field, its line and the file.
class yaml_to_json {
 public:
  std::unordered_map<std::string, int> lines;

  explicit yaml_to_json(std::string name) : name_(std::move(name)) {}

  nlohmann::json convert(const YAML::Node& n, const std::string& path, std::size_t depth = 0) {
    const int line = n.Mark().line + 1;
    lines.emplace(path, line);
    if (++nodes_ > yaml_limits::max_nodes) {
      fail(path, line,
           fmt::format("the document expands to more than {} values (aliases count each time "
                       "they are used)",
                       yaml_limits::max_nodes));
    }
    switch (n.Type()) {
      case YAML::NodeType::Sequence:
      case YAML::NodeType::Map:
        if (depth >= yaml_limits::max_depth)
          fail(path, line, fmt::format("nests deeper than {} levels", yaml_limits::max_depth));
        return n.IsMap() ? map(n, path, depth) : sequence(n, path, depth);
      case YAML::NodeType::Scalar:
        return scalar(n, path, line);
      default:
        return nullptr;
    }
  }

 private:
  [[noreturn]] void fail(const std::string& path, int line, const std::string& reason) const {
    throw doorman::config_error(path, fmt::format("{} (line {} of {})", reason, line, name_));
  }

  void count_bytes(std::string_view s, const std::string& path, int line) {
    bytes_ += s.size();
    if (bytes_ > yaml_limits::max_bytes) {
      fail(path, line,
           fmt::format("the document expands to more than {} bytes of keys and scalars",
                       yaml_limits::max_bytes));
    }
    if (!valid_utf8(s)) fail(path, line, "not valid UTF-8");
  }

  nlohmann::json sequence(const YAML::Node& n, const std::string& path, std::size_t depth) {
    nlohmann::json a = nlohmann::json::array();
    std::size_t i = 0;
    for (const auto& e : n)
      a.push_back(convert(e, path + '[' + std::to_string(i++) + ']', depth + 1));
    return a;
  }

  nlohmann::json map(const YAML::Node& n, const std::string& path, std::size_t depth) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& kv : n) {
      const int line = kv.first.Mark().line + 1;
      if (!kv.first.IsScalar()) fail(path, line, "a key must be a scalar (a string)");
      const std::string& key = kv.first.Scalar();
      const std::string child = path.empty() ? key : path + "." + key;
      count_bytes(key, child, line);
      lines.emplace(child, line);
      o[key] = convert(kv.second, child, depth + 1);
    }
    return o;
  }

  // A plain scalar is a number, a boolean or null when it reads as one; a quoted one is a
  // string.
  nlohmann::json scalar(const YAML::Node& n, const std::string& path, int line) {
    const std::string& s = n.Scalar();
    count_bytes(s, path, line);
    if (n.Tag() == "!") return s;
    if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    auto number = nlohmann::json::parse(s, nullptr, false);
    if (number.is_number()) return number;
    return s;
  }

  std::string name_;
  std::size_t nodes_ = 0;
  std::size_t bytes_ = 0;
};

inline void doorman_forms(nlohmann::json& doc) {
  static constexpr const char* kinds[] = {"NO_ALGORITHM", "STATIC", "PROPORTIONAL_SHARE",
                                          "FAIR_SHARE"};
  if (!doc.is_object() || !doc.contains("resources") || !doc["resources"].is_array()) return;
  for (auto& t : doc["resources"]) {
    if (!t.is_object() || !t.contains("algorithm") || !t["algorithm"].is_object()) continue;
    auto& a = t["algorithm"];
    if (const auto k = a.find("kind"); k != a.end() && k->is_number_integer() &&
                                       k->get<std::int64_t>() >= 0 && k->get<std::int64_t>() <= 3) {
      *k = kinds[k->get<std::int64_t>()];
    }
    if (const auto p = a.find("parameters"); p != a.end() && p->is_array()) {
      nlohmann::json named = nlohmann::json::object();
      for (const auto& e : *p) {
        if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) return;  // validated
        named[e["name"].get<std::string>()] = e.value("value", nlohmann::json(""));
      }
      *p = std::move(named);
    }
  }
}

// The line of `path` or of its nearest ancestor that has one.
inline int line_of(const std::unordered_map<std::string, int>& lines, std::string path) {
  for (;;) {
    if (const auto it = lines.find(path); it != lines.end()) return it->second;
    const auto cut = path.find_last_of(".[");
    if (cut == std::string::npos) return 0;
    path.resize(cut);
  }
}

}  // namespace detail

// Doorman's YAML as the JSON form; throws doorman::config_error naming file, line and field.
inline nlohmann::json yaml_config_json(std::string_view text, const std::string& name,
                                       std::unordered_map<std::string, int>* lines = nullptr) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw doorman::config_error(
        "", fmt::format("{}:{}: not valid YAML: {}", name, e.mark.line + 1, e.msg));
  }
  detail::yaml_to_json conv(name);
  nlohmann::json doc;
  try {
    doc = conv.convert(root, "");
  } catch (const YAML::Exception& e) {  // yaml-cpp reads lazily: a problem may show here
    throw doorman::config_error(
        "", fmt::format("{}:{}: not valid YAML: {}", name, e.mark.line + 1, e.msg));
  }
  detail::doorman_forms(doc);
  if (lines) *lines = std::move(conv.lines);
  return doc;
}

// Parses Doorman's YAML; errors read "FILE:LINE: field: reason".
// `parse(json)` of the YAML `text`, its errors made to read "field: reason (line N of FILE)".
template <class Parse>
auto parse_yaml_with(std::string_view text, const std::string& name, Parse parse) {
  std::unordered_map<std::string, int> lines;
  const auto doc = yaml_config_json(text, name, &lines);
  try {
    return parse(doc);
  } catch (const doorman::config_error& e) {
    throw doorman::config_error(e.path(), fmt::format("{} (line {} of {})", e.reason(),
                                                      detail::line_of(lines, e.path()), name));
  }
}

inline doorman::resource_repository parse_yaml_config(std::string_view text,
                                                      const std::string& name) {
  return parse_yaml_with(text, name, [](const nlohmann::json& doc) {
    return doorman::resource_repository::parse(doc.dump());
  });
}

// An access file in YAML (docs/security.md); errors read "field: reason (line N of FILE)".
inline doorman::access_policy parse_yaml_access(std::string_view text, const std::string& name) {
  return parse_yaml_with(
      text, name, [](const nlohmann::json& doc) { return doorman::access_policy::from_json(doc); });
}

// A rule file (docs/algorithms.md, "Rules") in YAML, as Lyft's ratelimit writes it.
inline doorman::rule_set parse_yaml_rules(std::string_view text, const std::string& name) {
  return parse_yaml_with(text, name,
                         [](const nlohmann::json& doc) { return doorman::rule_set::parse(doc); });
}

#else

inline doorman::resource_repository parse_yaml_config(std::string_view, const std::string& name) {
  throw doorman::config_error("", name + ": this binary was built without YAML support (yaml-cpp)");
}

inline doorman::access_policy parse_yaml_access(std::string_view, const std::string& name) {
  throw doorman::config_error("", name + ": this binary was built without YAML support (yaml-cpp)");
}

inline doorman::rule_set parse_yaml_rules(std::string_view, const std::string& name) {
  throw doorman::config_error("", name + ": this binary was built without YAML support (yaml-cpp)");
}

#endif

// The binaries' access file parser: YAML for a .yml/.yaml path, else JSON.
inline doorman::access_policy parse_access_any(std::string_view text, const std::string& name) {
  if (is_yaml(text, name)) return parse_yaml_access(text, name);
  return doorman::access_policy::parse(text);
}

// The binaries' parser: YAML (see is_yaml) or JSON.
inline doorman::resource_repository parse_config_any(std::string_view text,
                                                     const std::string& name) {
  if (is_yaml(text, name)) return parse_yaml_config(text, name);
  return doorman::resource_repository::parse(text);
}

// A rule file: YAML for a .yml/.yaml path, else JSON. Errors name the field.
inline doorman::rule_set parse_rules_any(std::string_view text, const std::string& name) {
  if (is_yaml(text, name)) return parse_yaml_rules(text, name);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text, nullptr, true, true);
  } catch (const nlohmann::json::exception& e) {
    throw doorman::config_error("", name + ": not valid JSON: " + e.what());
  }
  return doorman::rule_set::parse(doc);
}

}  // namespace doorman_examples
