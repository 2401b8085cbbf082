#pragma once
// Progress on stderr for long runs: on a terminal one line redrawn in place, otherwise plain
// lines (a stage as it starts, a file's bytes at most every 10 %), nothing with -q.

#include <chrono>
#include <cstdint>
#include <string>

#include "ctxgen/pipeline.h"

namespace ctxgen::cli {

class ProgressDisplay {
 public:
  explicit ProgressDisplay(bool enabled);
  ~ProgressDisplay() { clear(); }
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  void show(const Progress& progress);  // a compile/share stage or file
  void show(const std::string& step);   // a verify step
  // Removes the line being redrawn, so results printed next start on a clean line.
  void clear();

 private:
  void put(const std::string& text);

  bool enabled_, terminal_;
  bool drawn_ = false;
  int last_percent_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace ctxgen::cli
