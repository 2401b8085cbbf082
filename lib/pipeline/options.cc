// Scoped shape options and share manifests. A manifest's per-model shapes are turned into scoped
// text ("stem:name=value") so both routes meet in resolve_shapes and fail the same way.

#include "ctxgen/options.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ctxgen/error.h"
#include "ctxgen/limits.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

Error usage(const std::string& what) { return Error(ErrorCode::kUsage, what); }

struct Assignment {
  std::string scope, name, value;
};

// "[MODEL:]NAME=VALUE". MODEL is a scope only where it is the file stem of one of the models (the
// longest that fits), so names that hold a ':' themselves ("input:0") still work unscoped.
Assignment split(const std::string& text, const std::string& option, const std::vector<std::string>& stems) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw usage(option + " '" + text + "': expected [MODEL:]NAME=VALUE");
  Assignment a;
  a.name = text.substr(0, eq);
  a.value = text.substr(eq + 1);
  for (const auto& stem : stems)
    if (a.name.size() > stem.size() + 1 && a.name.compare(0, stem.size() + 1, stem + ":") == 0 && stem.size() >= a.scope.size())
      a.scope = stem;
  if (!a.scope.empty()) a.name = a.name.substr(a.scope.size() + 1);
  if (a.name.empty() || a.name.front() == ':') throw usage(option + " '" + text + "': expected [MODEL:]NAME=VALUE");
  return a;
}

int64_t parse_dim(const std::string& text, const std::string& context) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
    throw usage(context + ": '" + text + "' is not a non-negative integer");
  return std::stoll(text);
}

std::vector<int64_t> parse_shape(const std::string& text, const std::string& context) {
  if (text.back() == 'x') throw usage(context + ": '" + text + "' ends with 'x'");
  std::vector<int64_t> dims;
  std::stringstream parts(text);
  for (std::string part; std::getline(parts, part, 'x');) dims.push_back(parse_dim(part, context));
  if (!bounded_element_count(dims)) throw usage(context + ": '" + text + "' holds more than 2^48 values");
  return dims;
}

std::vector<std::string> parse_values(const std::string& text, const std::string& context) {
  std::vector<std::string> values;
  std::stringstream parts(text);
  for (std::string part; std::getline(parts, part, ',');) values.push_back(part);
  if (values.empty() || text.back() == ',') throw usage(context + ": '" + text + "' is not a list of values");
  return values;
}

// Sets map[name] = value, refusing a second different value for the same model.
template <typename V>
void assign(std::map<std::string, V>& map, const std::string& name, const V& value, const std::string& what) {
  auto [it, added] = map.emplace(name, value);
  if (!added && it->second != value) throw usage(what + ": given twice with different values");
}

}  // namespace

namespace {

// Values in `over` replace those of the same name in `base`.
template <typename V>
void overlay(std::map<std::string, V>& base, const std::map<std::string, V>& over) {
  for (const auto& [name, value] : over) base[name] = value;
}

// One kind of option (`member` of LoadOptions) for every model: unscoped values for all, scoped
// ones for one, each name given at most one value per scope; scoped values win.
template <typename V, typename Parse>
void resolve(const std::vector<std::string>& items, const std::string& option, const std::vector<std::string>& stems,
             Parse parse, std::map<std::string, V> LoadOptions::*member, std::vector<LoadOptions>& out) {
  std::vector<std::map<std::string, V>> scoped(stems.size());
  for (const auto& item : items) {
    Assignment a = split(item, option, stems);
    std::string what = option + " " + (a.scope.empty() ? "" : a.scope + ":") + a.name;
    V value = parse(a.value, what);
    for (size_t m = 0; m < stems.size(); ++m) {
      if (a.scope.empty()) assign(out[m].*member, a.name, value, what);
      else if (stems[m] == a.scope) assign(scoped[m], a.name, value, what);
    }
  }
  for (size_t m = 0; m < stems.size(); ++m) overlay(out[m].*member, scoped[m]);
}

}  // namespace

std::vector<LoadOptions> resolve_shapes(const std::vector<fs::path>& models, const ShapeArgs& args) {
  std::vector<std::string> stems;
  for (const auto& m : models) stems.push_back(file_stem(m));
  std::vector<LoadOptions> out(models.size());
  resolve(args.fix_dims, "--fix-dim", stems, parse_dim, &LoadOptions::fix_dims, out);
  resolve(args.input_shapes, "--input-shape", stems, parse_shape, &LoadOptions::input_shapes, out);
  resolve(args.fix_values, "--fix-value", stems, parse_values, &LoadOptions::fix_values, out);
  return out;
}

void override_with(std::vector<LoadOptions>& base, const std::vector<LoadOptions>& over) {
  for (size_t m = 0; m < base.size() && m < over.size(); ++m) {
    overlay(base[m].fix_dims, over[m].fix_dims);
    overlay(base[m].input_shapes, over[m].input_shapes);
    overlay(base[m].fix_values, over[m].fix_values);
  }
}

namespace {

void expect_keys(const nlohmann::json& object, const std::set<std::string>& known, const std::string& where) {
  if (!object.is_object()) throw usage(where + ": expected a JSON object");
  for (const auto& [key, value] : object.items())
    if (!known.count(key)) throw usage(where + ": unknown key '" + key + "'");
}

// A string of the manifest; a NUL in it would end the path or name the system sees early.
std::string text_of(const nlohmann::json& j, const std::string& where) {
  if (!j.is_string()) throw usage(where + ": expected a string");
  std::string text = j.get<std::string>();
  if (text.find('\0') != std::string::npos) throw usage(where + ": holds a NUL character");
  return text;
}

// {"name": 1} -> "scope:name=1"; {"input": [1, 128]} -> "scope:input=1x128".
void add_shapes(const nlohmann::json& object, const std::string& scope, ShapeArgs& shapes, const std::string& where) {
  std::string prefix = scope.empty() ? "" : scope + ":";
  if (object.contains("fix_dim")) {
    const auto& dims = object["fix_dim"];
    if (!dims.is_object()) throw usage(where + ": fix_dim must map dimension names to sizes");
    for (const auto& [name, value] : dims.items()) {
      if (!value.is_number_unsigned()) throw usage(where + ": fix_dim '" + name + "' must be a non-negative integer");
      shapes.fix_dims.push_back(prefix + name + "=" + std::to_string(value.get<uint64_t>()));
    }
  }
  if (object.contains("fix_value")) {
    const auto& values = object["fix_value"];
    if (!values.is_object()) throw usage(where + ": fix_value must map input names to a number or a list of numbers");
    for (const auto& [name, value] : values.items()) {
      std::string text;
      for (const auto& v : value.is_array() ? value : nlohmann::json::array({value})) {
        if (!v.is_number() && !v.is_boolean()) throw usage(where + ": fix_value '" + name + "' must hold numbers");
        text += (text.empty() ? "" : ",") + (v.is_boolean() ? std::string(v.get<bool>() ? "1" : "0") : v.dump());
      }
      if (text.empty()) throw usage(where + ": fix_value '" + name + "' is empty");
      shapes.fix_values.push_back(prefix + name + "=" + text);
    }
  }
  if (object.contains("input_shape")) {
    const auto& inputs = object["input_shape"];
    if (!inputs.is_object()) throw usage(where + ": input_shape must map input names to lists of sizes");
    for (const auto& [name, value] : inputs.items()) {
      if (!value.is_array() || value.empty()) throw usage(where + ": input_shape '" + name + "' must be a list of sizes");
      std::string text;
      for (const auto& d : value) {
        if (!d.is_number_unsigned()) throw usage(where + ": input_shape '" + name + "' must hold non-negative integers");
        text += (text.empty() ? "" : "x") + std::to_string(d.get<uint64_t>());
      }
      shapes.input_shapes.push_back(prefix + name + "=" + text);
    }
  }
}

}  // namespace

Manifest read_manifest(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw usage(path.string() + ": no such manifest file");
  if (!fs::is_regular_file(path, ec)) throw usage(path.string() + ": the manifest is not a regular file");
  std::ifstream in(path);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (!in) throw Error(ErrorCode::kIo, path.string() + ": cannot read the manifest");
  return parse_manifest(text, path.parent_path(), path.string());
}

Manifest parse_manifest(const std::string& text, const fs::path& folder, const std::string& where) {
  nlohmann::json j;
  // JSON lets an object give a key twice (the last one counts): in a manifest that is a mistake.
  std::vector<std::set<std::string>> keys;  // of each object being read, innermost last
  const auto once = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end) keys.pop_back();
    if (event == Event::key && !keys.back().insert(parsed.get<std::string>()).second)
      throw usage(where + ": key '" + parsed.get<std::string>() + "' is given twice in one object");
    return true;
  };
  try {
    j = nlohmann::json::parse(text, once);
  } catch (const nlohmann::json::exception& e) {
    throw usage(where + ": not valid JSON: " + e.what());
  }
  expect_keys(j, {"models", "output_dir", "backend", "target_cpu", "fix_dim", "input_shape", "fix_value",
                  "node_name_prefix", "external_initializers_file", "embed", "weightless"}, where);
  if (!j.contains("models") || !j["models"].is_array() || j["models"].empty())
    throw usage(where + ": 'models' must be a non-empty list");
  Manifest m;
  add_shapes(j, "", m.shapes, where);
  for (size_t i = 0; i < j["models"].size(); ++i) {
    const auto& entry = j["models"][i];
    std::string at = where + ": models[" + std::to_string(i) + "]";
    expect_keys(entry, {"path", "fix_dim", "input_shape", "fix_value"}, at);
    if (!entry.contains("path")) throw usage(at + ": 'path' is missing");
    fs::path model = text_of(entry["path"], at + ".path");
    m.models.push_back(model.is_absolute() ? model : folder / model);
    add_shapes(entry, file_stem(m.models.back()), m.shapes, at);
  }
  if (j.contains("output_dir")) {
    fs::path out = text_of(j["output_dir"], where + ": output_dir");
    m.options.output_dir = out.is_absolute() ? out : folder / out;
  }
  if (j.contains("backend")) m.options.backend = text_of(j["backend"], where + ": backend");
  if (j.contains("target_cpu")) m.options.target = text_of(j["target_cpu"], where + ": target_cpu");
  if (j.contains("node_name_prefix")) m.options.node_name_prefix = text_of(j["node_name_prefix"], where + ": node_name_prefix");
  if (j.contains("external_initializers_file"))
    m.options.external_initializers_file = text_of(j["external_initializers_file"], where + ": external_initializers_file");
  if (j.contains("weightless")) {
    if (!j["weightless"].is_boolean()) throw usage(where + ": weightless must be true or false");
    m.options.weightless = j["weightless"].get<bool>();
  }
  if (j.contains("embed")) {
    if (!j["embed"].is_boolean()) throw usage(where + ": embed must be true or false");
    m.options.embed = j["embed"].get<bool>();
  }
  return m;
}

}  // namespace ctxgen
