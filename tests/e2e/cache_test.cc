// The compile cache (--cache): a warm run takes every partition from it and writes the bytes an
// uncached run writes, whatever the models are called or where they are; what changes the compile
// misses; damaged entries are dropped and compiled anew; concurrent runs share one cache.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "ctxgen/bytes.h"
#include "ctxgen/ref_program.h"
#include "e2e.h"
#include "framed.h"

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

// An entry's description and held bytes, and the entry made again from them with its hashes
// recomputed: what someone who writes into a cache can make.
using Entry = Framed;
Entry open_entry(const fs::path& path) { return read_framed(path, true); }
void write_entry(const fs::path& path, const Entry& e) { write_framed(path, "CTXGCC01", e, true); }

// Hashes say an entry is whole, not that it belongs where it lies: crafted entries with their
// hashes made anew are damaged (warned, removed, compiled anew), the outputs an uncached run's.
TEST(CompileCache, ACraftedEntryWithItsHashesMadeAnewIsDamaged) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const ShareRun plain = share(dir.path() / "models", dir.path() / "plain", "");
  share(dir.path() / "models", dir.path() / "cold", "--cache " + quote(cache));
  using Craft = std::function<void(Entry&, const Entry& other)>;
  const std::vector<std::pair<std::string, Craft>> crafts = {
      {"interned 2^62", [](Entry& e, const Entry&) { e.header["weights"][0]["interned"] = uint64_t{1} << 62; }},
      {"interned -1", [](Entry& e, const Entry&) { e.header["weights"][0]["interned"] = -1; }},
      {"another partition's entry", [](Entry& e, const Entry& other) { e = other; }},
      {"an output renamed", [](Entry& e, const Entry&) { e.header["outputs"][0]["name"] = "renamed"; }},
      {"output dims [1,17]", [](Entry& e, const Entry&) { e.header["outputs"][0]["dims"] = {1, 17}; }},
      {"an output of int64", [](Entry& e, const Entry&) { e.header["outputs"][0]["elem_type"] = 7; }},
      {"a program the validator rejects", [](Entry& e, const Entry&) {
         const uint64_t size = e.header["program_size"];
         ref::Program p = ref::deserialize(reinterpret_cast<const uint8_t*>(e.rest.data()), size);
         for (ref::Value& v : p.values) v.dims.assign(v.dims.size(), int64_t{1} << 40);
         const std::vector<uint8_t> program = ref::serialize(p);
         ASSERT_EQ(program.size(), size);
         e.rest.replace(0, size, reinterpret_cast<const char*>(program.data()), size);
         e.header["program_hash"] = xxh3_128(program.data(), program.size()).hex();
       }},
  };
  // Three at a time, on entries with weights; each round's warm run stores them again.
  for (size_t first = 0; first < crafts.size(); first += 3) {
    std::vector<fs::path> found;
    for (const fs::path& entry : entries(cache))
      if (!open_entry(entry).header.at("weights").empty()) found.push_back(entry);
    ASSERT_GE(found.size(), 4u);
    size_t crafted = 0;
    std::string names;
    for (size_t c = first; c < std::min(first + 3, crafts.size()); ++c, ++crafted) {
      Entry e = open_entry(found[crafted]);
      crafts[c].second(e, open_entry(found.back()));
      write_entry(found[crafted], e);
      names += crafts[c].first + "; ";
    }
    SCOPED_TRACE(names);
    const ShareRun warm = share(dir.path() / "models", dir.path() / ("warm" + std::to_string(first)), "--cache " + quote(cache));
    EXPECT_EQ(count(warm, "damaged"), crafted) << warm.output;
    EXPECT_EQ(count(warm, "misses"), crafted) << warm.output;
    EXPECT_NE(warm.output.find("is damaged"), std::string::npos) << warm.output;
    expect_same_files(plain.files, warm.files);
  }
}

// With CTXGEN_CACHE_KEY, entries are signed and only entries signed with that key are used: an
// unsigned one, another key's, or one crafted without the key is damaged; the key is never shown.
TEST(CompileCache, WithAKeyOnlyEntriesSignedWithItAreUsed) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  const std::string key = "a-ci-secret-of-some-length", other = "another-secret-at-least-16";
  const ShareRun plain = share(dir.path() / "models", dir.path() / "plain", "");
  const ShareRun unsigned_run = share(dir.path() / "models", dir.path() / "unsigned", "--cache " + quote(cache));
  const uint64_t partitions = count(unsigned_run, "misses");
  const auto with_key = [&](const std::string& k, const std::string& name) {
    setenv("CTXGEN_CACHE_KEY", k.c_str(), 1);
    ShareRun run = share(dir.path() / "models", dir.path() / name, "--cache " + quote(cache));
    unsetenv("CTXGEN_CACHE_KEY");
    EXPECT_EQ(run.output.find(k), std::string::npos) << run.output;
    expect_same_files(plain.files, run.files);
    return run;
  };
  // Unsigned entries are damaged under a key; compiled anew, they are stored signed.
  ShareRun run = with_key(key, "signed");
  EXPECT_EQ(count(run, "damaged"), partitions) << run.output;
  EXPECT_NE(run.output.find("it is not signed"), std::string::npos) << run.output;
  run = with_key(key, "warm");
  EXPECT_EQ(count(run, "hits"), partitions) << run.output;
  // Another key's entries are damaged too.
  run = with_key(other, "other");
  EXPECT_EQ(count(run, "damaged"), partitions) << run.output;
  EXPECT_NE(run.output.find("not signed with CTXGEN_CACHE_KEY"), std::string::npos) << run.output;
  // An entry rewritten without the key, its hashes made anew, is damaged under the key.
  std::vector<fs::path> found = entries(cache);
  ASSERT_EQ(found.size(), partitions);
  Entry e = open_entry(found[0]);
  e.header["note"] = "added by someone without the key";  // well-formed, all hashes right
  write_entry(found[0], e);
  run = with_key(other, "crafted");
  EXPECT_EQ(count(run, "damaged"), 1u) << run.output;
  // A key too short to sign with is a usage error that does not show it.
  setenv("CTXGEN_CACHE_KEY", "short-key", 1);
  const auto r = ctxgen("compile " + quote(mixed_group()[2]) + " --fix-dim batch=1 --output-dir " + quote(dir.path() / "short") +
                        " --cache " + quote(cache));
  unsetenv("CTXGEN_CACHE_KEY");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("CTXGEN_CACHE_KEY holds 9 bytes"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("short-key"), std::string::npos) << r.output;
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
  EXPECT_TRUE(!fs::exists(cache / "hashes") || fs::is_empty(cache / "hashes"));
  r = ctxgen("cache stats --cache " + quote(dir.path()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is not a ctxgen compile cache"), std::string::npos) << r.output;
  r = ctxgen("cache prune --cache " + quote(cache) + " --max-size 12Q");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// ctxgen never deletes what it did not make: a cache is a folder it marked, and prune and clear
// remove only the names it writes there, never through a link. Its memo files are read only when
// they are regular files, so a FIFO or a device in their place costs nothing.
TEST(CompileCache, PruneAndClearTouchOnlyWhatCtxgenWrote) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache", elsewhere = dir.path() / "elsewhere";
  const fs::path cnn = mixed_group()[2];
  const auto compile = [&](const fs::path& folder, const std::string& more = "") {
    return ctxgen("compile " + quote(cnn) + " --fix-dim batch=1 --force --output-dir " + quote(dir.path() / "out") +
                  " --cache " + quote(folder) + " " + more);
  };
  auto r = compile(cache);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::is_regular_file(cache / "CACHEDIR.TAG"));
  const auto found = entries(cache);
  ASSERT_EQ(found.size(), 1u);
  const std::string prefix = found[0].parent_path().filename().string();

  // The user's files among the cache's, and a link to a folder of theirs shaped like entries.
  fs::create_directories(elsewhere / prefix);
  fs::create_directories(cache / "hashes");
  const std::string entry_shaped = prefix + std::string(30, '0');
  for (const fs::path& f : {cache / "entries" / "notes.txt", cache / "entries" / prefix / "mine.txt", cache / "notes.txt",
                            elsewhere / prefix / entry_shaped, cache / "hashes" / "mine.txt"})
    write_file(f, "the user's");
  fs::create_directory_symlink(elsewhere / prefix, cache / "entries" / (prefix == "ff" ? "fe" : "ff"));
  // A killed run's download: not an entry, removed by prune.
  write_file(found[0].parent_path() / ".fetch-2147483647-x", "half");
  r = ctxgen("cache stats --cache " + quote(cache));
  EXPECT_NE(r.output.find(": 1 entries"), std::string::npos) << r.output;
  r = ctxgen("cache prune --cache " + quote(cache) + " --max-size 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("removed 1 entries"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(found[0].parent_path() / ".fetch-2147483647-x"));
  r = compile(cache);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("cache clear --cache " + quote(cache));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("cache stats --cache " + quote(cache));
  EXPECT_NE(r.output.find(": 0 entries"), std::string::npos) << r.output;
  for (const fs::path& f : {cache / "entries" / "notes.txt", cache / "entries" / prefix / "mine.txt", cache / "notes.txt",
                            elsewhere / prefix / entry_shaped, cache / "hashes" / "mine.txt"})
    EXPECT_EQ(read_file(f), "the user's") << f;

  // A folder ctxgen did not mark is not a cache, whatever it holds.
  const fs::path mine = dir.path() / "mine";
  fs::create_directories(mine / "entries" / prefix);
  write_file(mine / "entries" / prefix / found[0].filename(), "the user's");
  for (const std::string action : {"stats", "clear", "prune --max-size 0"}) {
    r = ctxgen("cache " + action + " --cache " + quote(mine));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("is not a ctxgen compile cache"), std::string::npos) << r.output;
  }
  write_file(mine / "report.txt", "the user's");
  r = compile(mine);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("give a new or empty folder"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(mine / "entries" / prefix / found[0].filename()), "the user's");
  EXPECT_FALSE(fs::exists(mine / "CACHEDIR.TAG"));

  // A marked cache whose entries/ is a link: not followed.
  const fs::path linked = dir.path() / "linked";
  ASSERT_EQ(compile(linked).exit_code, 0);
  fs::remove_all(linked / "entries");
  fs::create_directory_symlink(elsewhere, linked / "entries");
  r = ctxgen("cache clear --cache " + quote(linked));
  EXPECT_EQ(read_file(elsewhere / prefix / entry_shaped), "the user's");

  // Memo files that are not regular files: a FIFO, a link to /dev/zero, a folder.
  ASSERT_EQ(compile(cache).exit_code, 0);
  std::vector<fs::path> memos;
  for (const auto& e : fs::directory_iterator(cache / "hashes"))
    if (e.path().filename() != "mine.txt") memos.push_back(e.path());
  ASSERT_FALSE(memos.empty());
  for (int kind = 0; kind < 3; ++kind) {
    for (const fs::path& memo : memos) {
      fs::remove_all(memo);
      if (kind == 0) {
        ASSERT_EQ(::mkfifo(memo.c_str(), 0600), 0);
      } else if (kind == 1) {
        fs::create_symlink("/dev/zero", memo);
      } else {
        fs::create_directory(memo);
      }
    }
    r = compile(cache);
    EXPECT_EQ(r.exit_code, 0) << "kind " << kind << ": " << r.output;
  }

  // --cache-max-size 0 bounds the cache as prune --max-size 0 does: to nothing.
  ASSERT_EQ(compile(dir.path() / "bounded", "--cache-max-size 0").exit_code, 0);
  EXPECT_TRUE(entries(dir.path() / "bounded").empty());
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
