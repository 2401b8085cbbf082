#include "profile.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "ctxgen/log.h"

namespace ctxgen::runtime::profile {
namespace {

// A run of many small ops is millions of events in a few minutes: past this many, runs are
// counted in the table but not kept as events (the trace says how many were left out).
constexpr size_t kMaxEvents = 1000000;

struct Event {
  std::string name, type, graph, dims;
  int64_t start_us = 0, duration_ns = 0;
  size_t thread = 0;
};

struct ByType {
  uint64_t runs = 0;
  int64_t ns = 0;
};

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += static_cast<char>(c);
  }
  return out + "\"";
}

class Collector {
 public:
  static Collector& instance() {
    static Collector* collector = new Collector();  // lives until exit, when it writes the file
    return *collector;
  }

  const std::string& path() const { return path_; }

  void add(Event event) {
    std::lock_guard<std::mutex> lock(mutex_);
    ByType& total = by_type_[event.type];
    total.runs += 1;
    total.ns += event.duration_ns;
    if (events_.size() < kMaxEvents) events_.push_back(std::move(event));
    else ++dropped_;
    dirty_ = true;
  }

  Clock::time_point origin() const { return origin_; }

  void write() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!dirty_) return;
    dirty_ = false;
    std::ofstream out(path_, std::ios::trunc);
    const int pid = static_cast<int>(::getpid());
    out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    for (size_t i = 0; i < events_.size(); ++i) {
      const Event& e = events_[i];
      char times[96];
      std::snprintf(times, sizeof times, "\"ts\": %lld, \"dur\": %.3f", static_cast<long long>(e.start_us), e.duration_ns / 1e3);
      out << (i ? ",\n" : "") << "{\"name\": " << json_string(e.name) << ", \"cat\": \"op\", \"ph\": \"X\", " << times
          << ", \"pid\": " << pid << ", \"tid\": " << e.thread << ", \"args\": {\"op_type\": " << json_string(e.type)
          << ", \"graph\": " << json_string(e.graph) << ", \"output\": " << json_string(e.dims) << "}}";
    }
    int64_t total = 0;
    for (const auto& [type, t] : by_type_) total += t.ns;
    out << "\n], \"otherData\": {\"events_left_out\": " << dropped_ << ", \"by_op_type\": [";
    bool first = true;
    for (const auto& [type, t] : by_type_) {
      char row[160];
      std::snprintf(row, sizeof row, "\"runs\": %llu, \"ms\": %.3f, \"share\": %.4f", static_cast<unsigned long long>(t.runs),
                    t.ns / 1e6, total > 0 ? static_cast<double>(t.ns) / static_cast<double>(total) : 0.0);
      out << (first ? "\n" : ",\n") << "{\"op_type\": " << json_string(type) << ", " << row << "}";
      first = false;
    }
    out << "\n]}}\n";
    if (!out.flush()) log().error("CTXGEN_PROFILE: cannot write {}", path_);
  }

 private:
  Collector() : origin_(Clock::now()) {
    const char* path = std::getenv("CTXGEN_PROFILE");
    if (path == nullptr || *path == '\0') return;
    path_ = path;
    std::atexit([] { instance().write(); });
  }

  std::string path_;
  Clock::time_point origin_;
  std::mutex mutex_;
  std::vector<Event> events_;
  std::map<std::string, ByType> by_type_;
  size_t dropped_ = 0;
  bool dirty_ = false;
};

std::string dims_text(const ref::Value& v) {
  std::string text = std::string(ref::dtype_name(v.dtype)) + " [";
  for (size_t i = 0; i < v.dims.size(); ++i) text += (i ? "," : "") + std::to_string(v.dims[i]);
  return text + "]";
}

}  // namespace

bool enabled() {
  static const bool on = !Collector::instance().path().empty();
  return on;
}

void save() {
  if (enabled()) Collector::instance().write();
}

void record(const std::string& graph, size_t index, const ref::Op& op, const ref::Value& out, Clock::time_point start,
            Clock::time_point end) {
  Collector& c = Collector::instance();
  Event e;
  e.name = op.type + " #" + std::to_string(index);
  e.type = op.type;
  e.graph = graph;
  e.dims = dims_text(out);
  e.start_us = std::chrono::duration_cast<std::chrono::microseconds>(start - c.origin()).count();
  e.duration_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
  e.thread = std::hash<std::thread::id>()(std::this_thread::get_id()) % 100000;
  c.add(std::move(e));
}

}  // namespace ctxgen::runtime::profile
