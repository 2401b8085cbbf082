// The context-path rules under a concurrent change of the model folder (the rules themselves, and
// their messages, are tested through ONNX Runtime in ort_plugin_test.cc).

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "ctxgen/context_path.h"
#include "ctxgen/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using ctxgen::ContextFile;
using ctxgen::open_context_file;

namespace {

// m/link.bin is an absolute link to m/bins/x.bin, which the rules allow and which takes the
// path-based resolution (openat2 refuses absolute links). Another thread keeps exchanging the
// folder m/bins with m/evil, a link to a folder outside holding a file of the same name: a check
// of the path followed by an open of it would, now and then, open the outside file.
TEST(ContextPath, AFolderSwappedForALinkDuringTheOpenNeverLeadsOutside) {
  ctxgen::testing::TempDir dir;
  const fs::path m = dir / "m";
  fs::create_directories(m / "bins");
  fs::create_directories(dir / "out");
  ctxgen::testing::write_file(m / "bins" / "x.bin", "inside");
  ctxgen::testing::write_file(dir / "out" / "x.bin", "SECRET");
  fs::create_symlink(fs::absolute(m / "bins" / "x.bin"), m / "link.bin");
  fs::create_symlink(fs::absolute(dir / "out"), m / "evil");
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    while (!stop) ::syscall(SYS_renameat2, AT_FDCWD, (m / "bins").c_str(), AT_FDCWD, (m / "evil").c_str(), RENAME_EXCHANGE);
  });
  int inside = 0, outside = 0, refused = 0;
  for (int i = 0; i < 20000 && outside == 0; ++i) {
    try {
      const ContextFile file = open_context_file(m, "link.bin", "n");
      char bytes[6] = {};
      ASSERT_EQ(::pread(file.fd.get(), bytes, sizeof bytes, 0), 6);
      (std::string(bytes, 6) == "inside" ? inside : outside)++;
    } catch (const ctxgen::Error&) {
      ++refused;  // the path changed between the check and the open
    }
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(outside, 0) << "opened the file outside the model folder (" << inside << " inside, " << refused << " refused)";
  EXPECT_GT(inside, 0) << "refused every time: the test checks nothing";
}

}  // namespace
