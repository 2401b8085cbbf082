#include "targets.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <csignal>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <fstream>
#include <cstring>
#include <iostream>
#include <set>
#include <sstream>

#include "ctxgen/context_path.h"
#include "ctxgen/error.h"
#include "ctxgen/log.h"
#include "ctxgen/outputs.h"
#include "ctxgen/report.h"
#include "ctxgen/runtime.h"
#include "package.h"

namespace fs = std::filesystem;

namespace ctxgen::cli {
namespace {

// `text` with the staging folder's path replaced by the level's final folder.
std::string placed(std::string text, const std::string& staging, const std::string& final) {
  for (size_t at = text.find(staging); at != std::string::npos; at = text.find(staging, at + final.size()))
    text.replace(at, staging.size(), final);
  return text;
}

void place_paths(nlohmann::json& j, const std::string& staging, const std::string& final) {
  if (j.is_string()) j = placed(j.get<std::string>(), staging, final);
  if (j.is_structured())
    for (auto& item : j) place_paths(item, staging, final);
}

// One level's compile, writing into `staging`; returns its summary, naming the files where they
// will be once every level's outputs are in place. The level is the compile's own setting, so the
// levels compile one after another in this process.
std::string compile_level(const std::vector<fs::path>& models, CompileOptions options, const std::string& level,
                          const fs::path& staging, const fs::path& final, const BackendRegistry& backends) {
  options.target = level;
  options.output_dir = staging;
  options.force = false;
  if (!options.report_file.empty()) options.report_file = staging / options.report_file.filename();
  return placed(report_text(compile_models(models, options, backends)), staging.string(), final.string());
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw Error(ErrorCode::kIo, path.string() + ": cannot write");
}

}  // namespace

std::vector<std::string> target_levels(const std::string& target) {
  std::vector<std::string> levels;
  std::stringstream list(target);
  for (std::string level; std::getline(list, level, ',');) levels.push_back(level);
  if (!target.empty() && target.back() == ',') levels.emplace_back();
  std::set<std::string> seen;
  for (const auto& level : levels) {
    if (level.empty()) throw Error(ErrorCode::kUsage, "--target-cpu " + target + ": an empty level in the list");
    if (!seen.insert(level).second) throw Error(ErrorCode::kUsage, "--target-cpu " + target + ": " + level + " is given twice");
  }
  return levels;
}

void compile_levels(const std::vector<fs::path>& models, const CompileOptions& options,
                   const std::vector<std::string>& levels, const BackendRegistry& backends, bool quiet) {
  const std::string what = "--target-cpu with several levels";
  if (!options.output_file.empty()) throw Error(ErrorCode::kUsage, what + " writes each level's outputs in a folder of its own: give --output-dir, not -o");
  if (options.stop_after) throw Error(ErrorCode::kUsage, what + " compiles; --stop-after writes no level's outputs");
  if (options.report_file == kStdoutReport)
    throw Error(ErrorCode::kUsage, what + ": each level's report goes into its folder; give --report FILE, not -");
  const fs::path folder = !options.output_dir.empty() ? options.output_dir : models.front().parent_path();
  // The models are planned now, so an existing output (without --force) or a model among the
  // outputs is refused before any level compiles; the rest of a level's files are adopted at the end.
  std::vector<fs::path> planned;
  for (const auto& level : levels) {
    for (const auto& model : models) planned.push_back(folder / level / (file_stem(model) + "_ctx.onnx"));
    if (!options.report_file.empty()) planned.push_back(folder / level / options.report_file.filename());
  }
  OutputSet outputs(planned, options.force, read_files(models, options));
  std::vector<std::unique_ptr<StagingFolder>> staged;
  std::string summaries;
  for (const auto& level : levels) {
    const fs::path final = folder / level;
    staged.push_back(std::make_unique<StagingFolder>(final, "targets"));
    summaries += "[--target-cpu " + level + "]\n" + compile_level(models, options, level, staged.back()->path(), final, backends);
    if (!options.report_file.empty()) {
      // The report names the files where they will be.
      const fs::path report = staged.back()->path() / options.report_file.filename();
      nlohmann::json j = nlohmann::json::parse(read_text(report));
      place_paths(j, staged.back()->path().string(), final.string());
      write_text(report, j.dump(2) + "\n");
    }
  }
  for (size_t l = 0; l < levels.size(); ++l)
    for (const auto& entry : fs::directory_iterator(staged[l]->path()))
      outputs.adopt(entry.path(), folder / levels[l] / entry.path().filename());
  outputs.commit();
  if (!quiet) std::cout << summaries;
}

void compile_package(const std::vector<fs::path>& models, CompileOptions options, const std::vector<std::string>& given,
                    const BackendRegistry& backends, bool quiet, const fs::path& given_package) {
  // "dist/pkg/" names dist/pkg; a link to a folder, the folder it points to.
  const fs::path named = given_package.has_filename() ? given_package : given_package.parent_path();
  const fs::path package = fs::is_symlink(named) ? resolved_path(named, ErrorCode::kUsage) : named;
  const std::string what = "--package";
  if (!options.output_file.empty() || !options.output_dir.empty())
    throw Error(ErrorCode::kUsage, what + " names the package's folder; it takes no -o or --output-dir");
  if (options.stop_after) throw Error(ErrorCode::kUsage, what + " compiles; --stop-after writes no package");
  if (!options.report_file.empty()) throw Error(ErrorCode::kUsage, what + ": the package's manifest.json lists its files; it takes no --report");
  if (options.embed)
    throw Error(ErrorCode::kUsage, what + ": a package keeps its binaries beside the models, where variants share them; it takes no --embed");
  if (options.allow_empty)
    throw Error(ErrorCode::kUsage, what + ": each variant runs a compiled binary, so it takes no --allow-empty");
  if (options.weightless)
    throw Error(ErrorCode::kUsage, what + ": a package holds its weights, which its variants share; it takes no --weightless");
  if (package.filename() == "." || package.filename() == ".." || package.filename().empty())
    throw Error(ErrorCode::kUsage, package.string() + ": --package names the package's own folder, not '.' or '..'");
  check_replaceable(package);
  // The weights CPU nodes need go to a file, which the variants share instead of each model embedding them.
  if (options.external_initializers_file.empty())
    options.external_initializers_file = file_stem(models.front()) + "_initializers.data";
  check_names(models, options.external_initializers_file);
  // Replacing the package replaces everything in its folder: nothing the run reads may be there.
  const fs::path whole = resolved_path(package, ErrorCode::kUsage);
  for (const fs::path& input : read_files(models, options)) {
    const fs::path inside = resolved_path(input, ErrorCode::kUsage).lexically_relative(whole);
    if (!inside.empty() && *inside.begin() != "..")
      throw Error(ErrorCode::kUsage, package.string() + ": the package's folder holds " + input.string() +
                                         ", which this run reads; write the package elsewhere");
  }
  const fs::path parent = package.parent_path().empty() ? fs::path(".") : package.parent_path();
  struct stat folder {}, above {};
  if (::stat(package.c_str(), &folder) == 0 && ::stat(parent.c_str(), &above) == 0 && folder.st_dev != above.st_dev)
    throw Error(ErrorCode::kUsage, package.string() + ": a mount point; the package takes its folder's place in one "
                                       "rename, which cannot replace a mount point: give a folder inside it");
  OutputSet outputs({package / kPackageManifest}, options.force, read_files(models, options));
  // Runs into one package take turns (the lock on its folder): a staging folder named after it
  // whose process is gone is what a killed run left.
  const std::string name = whole.filename().string().substr(0, 100);
  const StagingFolder staging(parent, "package", name);
  std::error_code ec;
  const std::string prefix = "." + name + ".package.ctxgen-";
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string found = entry.path().filename().string();
    const std::string suffix = ".tmp";
    if (found.rfind(prefix, 0) != 0 || found.size() <= prefix.size() + suffix.size() ||
        found.compare(found.size() - suffix.size(), suffix.size(), suffix) != 0 || entry.path() == staging.path())
      continue;
    const std::string digits = found.substr(prefix.size(), found.size() - prefix.size() - suffix.size());
    pid_t pid = 0;
    const auto [end, parsed] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (parsed == std::errc() && end == digits.data() + digits.size() && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
      fs::remove_all(entry.path(), ec);
  }
  std::vector<LevelOutputs> levels;
  for (const std::string& level : highest_first(given)) {
    levels.push_back({level, staging.path() / "levels" / (level.empty() ? "host" : level)});
    fs::create_directories(levels.back().folder);
    compile_level(models, options, level, levels.back().folder, package, backends);
  }
  // Without --target-cpu the one level is this machine's.
  if (levels.size() == 1 && levels[0].level.empty()) levels[0].level = runtime::cpu_level();
  const fs::path written = staging.path() / "package";
  const PackageContents contents = write_package(models, levels, written);
  // The new package takes the old one's place in one step; the old goes with the staging folder,
  // once it is known to hold nothing but what ctxgen wrote: a file put there during the compile
  // puts the old package back.
  const auto exchange = [&] {
    if (::renameat2(AT_FDCWD, written.c_str(), AT_FDCWD, package.c_str(), RENAME_EXCHANGE) != 0)
      throw Error(ErrorCode::kIo, package.string() + ": cannot move the package into place: " + std::strerror(errno));
  };
  exchange();
  try {
    check_replaceable(written, package.string());
  } catch (const Error& e) {
    exchange();
    throw Error(ErrorCode::kUsage, package.string() + " changed while the package was compiled, so it is left as it was: " +
                                       e.what());
  }
  sync_folder(parent);
  outputs.commit();
  if (!quiet) {
    std::string names;
    for (const auto& level : levels) names += (names.empty() ? "" : ", ") + level.level;
    std::cout << "package " << package.string() << ": " << models.size() << " component(s) x " << levels.size()
              << " level(s) (" << names << "), " << contents.variants << " variants, " << contents.shared_assets
              << " shared asset(s), " << contents.bytes << " bytes; weights every level shares stored once: "
              << contents.shared_weight_bytes << " bytes\n";
  }
}

}  // namespace ctxgen::cli
