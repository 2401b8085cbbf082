// The compile cache (--cache): a warm run takes every partition from it and writes the bytes an
// uncached run writes, whatever the models are called or where they are; what changes the compile
// misses; damaged entries are dropped and compiled anew; concurrent runs share one cache.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

// Copies the group into `folder` (each model renamed with `prefix`) and shares it into `out`.
struct ShareRun {
  nlohmann::json report;
  std::map<std::string, std::string> files;
  std::string output;
};
ShareRun share(const fs::path& folder, const fs::path& out, const std::string& options, const std::string& prefix = "") {
  fs::create_directories(folder);
  std::string inputs;
  for (const auto& model : mixed_group()) {
    const fs::path copy = folder / (prefix + model.filename().string());
    if (!fs::exists(copy)) fs::copy_file(model, copy);
    inputs += (inputs.empty() ? "" : ",") + copy.string();
  }
  const fs::path report = out.parent_path() / (out.filename().string() + ".json");
  ShareRun run;
  const auto r = run_command(std::string(CTXGEN_BINARY) + " share " + inputs + " " + mixed_group_shapes(prefix) + " " + options +
                             " --output-dir " + quote(out) + " --report " + quote(report));
  run.output = r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return run;
  expect_valid_json(fs::path(CTXGEN_SOURCE_DIR) / "docs/report-schema.json", report);
  run.report = nlohmann::json::parse(read_file(report));
  run.files = file_contents(out);
  return run;
}

uint64_t count(const ShareRun& run, const char* what) { return run.report.at("cache").at(what).get<uint64_t>(); }

std::vector<fs::path> entries(const fs::path& cache) {
  std::vector<fs::path> found;
  for (const auto& e : fs::recursive_directory_iterator(cache / "entries"))
    if (e.is_regular_file()) found.push_back(e.path());
  return found;
}

TEST(CompileCache, AWarmRunTakesEveryPartitionFromItAndWritesTheSameBytes) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const ShareRun plain = share(dir.path() / "models", dir.path() / "plain", "");
  EXPECT_TRUE(plain.report.at("cache").is_null());
  const ShareRun cold = share(dir.path() / "models", dir.path() / "cold", "--cache " + quote(cache));
  const uint64_t partitions = count(cold, "misses");
  EXPECT_GT(partitions, 5u);
  EXPECT_EQ(count(cold, "hits"), 0u);
  EXPECT_GT(count(cold, "bytes_written"), 0u);
  const ShareRun warm = share(dir.path() / "models", dir.path() / "warm", "--cache " + quote(cache));
  EXPECT_EQ(count(warm, "hits"), partitions);
  EXPECT_EQ(count(warm, "misses"), 0u);
  EXPECT_EQ(count(warm, "bytes_read"), count(cold, "bytes_written"));
  EXPECT_NE(warm.output.find("cache: " + std::to_string(partitions) + " of " + std::to_string(partitions) +
                             " partitions from cache"),
            std::string::npos)
      << warm.output;
  expect_same_files(plain.files, cold.files);
  expect_same_files(plain.files, warm.files);

  // The same models elsewhere, under other names, through CTXGEN_CACHE: every partition still hits.
  setenv("CTXGEN_CACHE", cache.c_str(), 1);
  const ShareRun moved = share(dir.path() / "elsewhere", dir.path() / "moved", "", "renamed_");
  unsetenv("CTXGEN_CACHE");
  EXPECT_EQ(count(moved, "hits"), partitions);
  EXPECT_TRUE(moved.files.count("renamed_decoder_prefill_ref.bin"));

  // What the compile depends on changes the key: another CPU level compiles anew.
  const ShareRun other = share(dir.path() / "models", dir.path() / "avx2", "--target-cpu avx2 --cache " + quote(cache));
  EXPECT_EQ(count(other, "hits"), 0u);
  EXPECT_EQ(count(other, "misses"), partitions);
}

// Flips a byte of an entry: in its description, or its last (the last weight's).
void damage(const fs::path& entry, bool in_description) {
  std::string bytes = read_file(entry);
  uint64_t described = 0;
  std::memcpy(&described, bytes.data() + 8, 8);
  const size_t at = in_description ? 32 + described / 2 : bytes.size() - 1;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
  std::ofstream(entry, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(CompileCache, ADamagedEntryIsDroppedAndItsPartitionCompiledAnew) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const ShareRun plain = share(dir.path() / "models", dir.path() / "plain", "");
  const ShareRun cold = share(dir.path() / "models", dir.path() / "cold", "--cache " + quote(cache));
  const auto found = entries(cache);
  ASSERT_GE(found.size(), 4u);
  // Its description (read at once), its last weight (read when the binary is written; the
  // entries holding a packed Conv weight end with one), a truncated entry, an empty one.
  size_t damaged = 0;
  const auto ends_with_a_made_weight = [](const std::string& bytes) {
    uint64_t described = 0;
    std::memcpy(&described, bytes.data() + 8, 8);
    const auto d = nlohmann::json::parse(bytes.substr(32, described));
    return !d.at("weights").empty() && d.at("weights").back().at("blob").at("kind") == "made";
  };
  // Chosen by what they hold, whatever order their keys put them in.
  std::vector<fs::path> made, other;
  for (const fs::path& entry : found) (ends_with_a_made_weight(read_file(entry)) ? made : other).push_back(entry);
  ASSERT_GE(made.size(), 1u);
  ASSERT_GE(other.size(), 1u);
  damage(other.front(), true);
  damage(made.front(), false);
  damaged = 2;
  for (const fs::path& entry : found) {
    if (entry == other.front() || entry == made.front() || damaged == 4) continue;
    const std::string bytes = read_file(entry);
    std::ofstream(entry, std::ios::binary | std::ios::trunc) << (damaged == 2 ? bytes.substr(0, bytes.size() / 2) : "");
    ++damaged;
  }
  ASSERT_EQ(damaged, 4u);
  const ShareRun warm = share(dir.path() / "models", dir.path() / "warm", "--cache " + quote(cache));
  EXPECT_EQ(count(warm, "damaged"), 4u) << warm.output;
  EXPECT_NE(warm.output.find("is damaged"), std::string::npos) << warm.output;
  expect_same_files(plain.files, warm.files);
  // Compiled anew, each was stored again: the next run takes everything from the cache.
  const ShareRun again = share(dir.path() / "models", dir.path() / "again", "--cache " + quote(cache));
  EXPECT_EQ(count(again, "damaged"), 0u);
  EXPECT_EQ(count(again, "hits"), count(cold, "misses") - 1);  // the weight found damaged late is not stored again
  expect_same_files(plain.files, again.files);
}

TEST(CompileCache, RunsAtOnceShareOneCache) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const ShareRun plain = share(dir.path() / "models", dir.path() / "plain", "");
  // Four runs started together on a cold cache, each writing every entry.
  std::string both;
  for (int i = 0; i < 4; ++i) {
    std::string inputs;
    for (const auto& model : mixed_group()) inputs += (inputs.empty() ? "" : ",") + (dir.path() / "models" / model.filename()).string();
    both += std::string(i ? " & " : "") + CTXGEN_BINARY + " share " + inputs + " " + mixed_group_shapes() + " --cache " + quote(cache) +
            " --output-dir " + quote(dir.path() / ("run" + std::to_string(i))) + " -q";
  }
  const auto r = run_command("(" + both + "; wait)");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int i = 0; i < 4; ++i) expect_same_files(plain.files, file_contents(dir.path() / ("run" + std::to_string(i))));
  const ShareRun warm = share(dir.path() / "models", dir.path() / "warm", "--cache " + quote(cache));
  EXPECT_EQ(count(warm, "misses"), 0u);
  EXPECT_EQ(count(warm, "damaged"), 0u);
  expect_same_files(plain.files, warm.files);
}

uint64_t entry_bytes(const fs::path& cache) {
  uint64_t total = 0;
  for (const fs::path& e : entries(cache)) total += fs::file_size(e);
  return total;
}

// Pruning removes the least recently used entries: those of models a later run took from the
// cache stay, whatever order they were written in.
TEST(CompileCache, PruningKeepsTheEntriesUsedLast) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const auto compile = [&](const fs::path& model, const std::string& more) {
    const auto r = ctxgen("compile " + quote(model) + " --fix-dim batch=1 --force --output-dir " + quote(dir.path() / "out") +
                          " --cache " + quote(cache) + " " + more);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const fs::path cnn = mixed_group()[2], qdq = mixed_group()[4];
  compile(cnn, "");
  const uint64_t cnn_bytes = entry_bytes(cache);
  compile(qdq, "");
  ASSERT_GT(entry_bytes(cache), cnn_bytes);
  EXPECT_NE(compile(cnn, "").find("1 of 1 partitions from cache"), std::string::npos);  // the CNN's entry, used last
  auto r = ctxgen("cache prune --cache " + quote(cache) + " --max-size " + std::to_string(cnn_bytes));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(entry_bytes(cache), cnn_bytes);
  EXPECT_NE(compile(cnn, "").find("1 of 1 partitions from cache"), std::string::npos);
  EXPECT_NE(compile(qdq, "").find("0 of 1 partitions from cache"), std::string::npos);

  r = ctxgen("cache stats --cache " + quote(cache));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(": 2 entries"), std::string::npos) << r.output;
  // --cache-max-size bounds the cache at the end of a run; clear empties it.
  compile(cnn, "--cache-max-size 1K");
  EXPECT_LE(entry_bytes(cache), 1024u);
  r = ctxgen("cache clear --cache " + quote(cache));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(entries(cache).empty());
  EXPECT_FALSE(fs::exists(cache / "hashes"));
  r = ctxgen("cache stats --cache " + quote(dir.path()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is not a ctxgen compile cache"), std::string::npos) << r.output;
  r = ctxgen("cache prune --cache " + quote(cache) + " --max-size 12Q");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST(CompileCache, ACacheFolderThatCannotBeMadeIsAUsageError) {
  TempDir dir;
  std::ofstream(dir.path() / "file") << "x";
  const auto r = ctxgen("compile " + quote(mixed_group()[2]) + " --fix-dim batch=1 --output-dir " +
                        quote(dir.path() / "out") + " --cache " + quote(dir.path() / "file" / "cache"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot make the cache folder"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "out" / "cnn_upsample_ctx.onnx"));
}

}  // namespace
}  // namespace ctxgen::testing
