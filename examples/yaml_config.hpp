#pragma once

// Doorman's YAML configurations, read as they are (docs/configuration.md): the binaries'
// `config_options::parse`. The YAML becomes the JSON form the library validates, with
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

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

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

namespace detail {

// YAML -> JSON, remembering the line (from 1) of every field path.
class yaml_to_json {
 public:
  std::map<std::string, int> lines;

  nlohmann::json convert(const YAML::Node& n, const std::string& path) {
    lines.emplace(path, n.Mark().line + 1);
    switch (n.Type()) {
      case YAML::NodeType::Sequence: {
        nlohmann::json a = nlohmann::json::array();
        for (std::size_t i = 0; i < n.size(); ++i)
          a.push_back(convert(n[i], fmt::format("{}[{}]", path, i)));
        return a;
      }
      case YAML::NodeType::Map: {
        nlohmann::json o = nlohmann::json::object();
        for (const auto& kv : n) {
          const auto key = kv.first.as<std::string>();
          const std::string child = path.empty() ? key : path + "." + key;
          lines.emplace(child, kv.first.Mark().line + 1);
          o[key] = convert(kv.second, child);
        }
        return o;
      }
      case YAML::NodeType::Scalar:
        return scalar(n);
      default:
        return nullptr;
    }
  }

 private:
  // A plain scalar is a number, a boolean or null when it reads as one; a quoted one is a
  // string.
  static nlohmann::json scalar(const YAML::Node& n) {
    const std::string& s = n.Scalar();
    if (n.Tag() == "!") return s;
    if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    auto number = nlohmann::json::parse(s, nullptr, false);
    if (number.is_number()) return number;
    return s;
  }
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
inline int line_of(const std::map<std::string, int>& lines, std::string path) {
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
                                       std::map<std::string, int>* lines = nullptr) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw doorman::config_error(
        "", fmt::format("{}:{}: not valid YAML: {}", name, e.mark.line + 1, e.msg));
  }
  detail::yaml_to_json conv;
  auto doc = conv.convert(root, "");
  detail::doorman_forms(doc);
  if (lines) *lines = std::move(conv.lines);
  return doc;
}

// Parses Doorman's YAML; errors read "FILE:LINE: field: reason".
// `parse(json)` of the YAML `text`, its errors made to read "field: reason (line N of FILE)".
template <class Parse>
auto parse_yaml_with(std::string_view text, const std::string& name, Parse parse) {
  std::map<std::string, int> lines;
  const auto doc = yaml_config_json(text, name, &lines);
  try {
    return parse(doc);
  } catch (const doorman::config_error& e) {
    throw doorman::config_error(
        e.path(),
        fmt::format("{} (line {} of {})",
                    std::string_view(e.what()).substr(e.path().empty() ? 0 : e.path().size() + 2),
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
