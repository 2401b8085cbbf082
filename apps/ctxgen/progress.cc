#include "progress.h"

#include <unistd.h>

#include <cstdio>

#include "ctxgen/report.h"

namespace ctxgen::cli {

ProgressDisplay::ProgressDisplay(bool enabled) : enabled_(enabled), terminal_(::isatty(STDERR_FILENO) == 1) {}

void ProgressDisplay::show(const Progress& p) {
  if (!enabled_) return;
  std::string stage = p.stage;  // write_context_binary -> write context binary
  for (char& c : stage)
    if (c == '_') c = ' ';
  std::string text = (p.model_count > 0 ? "[" + std::to_string(p.model_index) + "/" + std::to_string(p.model_count) + "] "
                                         : std::string()) +
                     stage;
  if (!p.file.empty() || !p.model.empty()) text += " " + (p.file.empty() ? p.model : p.file).string();
  if (p.bytes_total == 0) {  // a stage starting
    last_percent_ = -1;
    put(text);
    return;
  }
  const int percent = static_cast<int>(100 * p.bytes_done / p.bytes_total);
  const bool done = p.bytes_done >= p.bytes_total;
  // Plain lines: every 10 %; a terminal: redrawn at most ten times a second.
  if (!terminal_ && !done && last_percent_ >= 0 && percent / 10 == last_percent_ / 10) return;
  const auto now = std::chrono::steady_clock::now();
  if (terminal_ && !done && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  last_percent_ = done ? -1 : percent;
  put(text + ": " + human_bytes(p.bytes_done) + " of " + human_bytes(p.bytes_total) + " (" + std::to_string(percent) + "%)");
}

void ProgressDisplay::show(const std::string& step) {
  if (enabled_) put(step);
}

void ProgressDisplay::put(const std::string& text) {
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    drawn_ = true;
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void ProgressDisplay::clear() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace ctxgen::cli
