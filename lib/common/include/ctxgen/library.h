#pragma once
// The one way a shared library the user names (`--ep-lib`, `verify --plugin`, CTXGEN_ORT_EP) is
// opened: checked before the dynamic loader sees it, which would block on a FIFO, die of SIGBUS on
// a truncated file, or look a relative name up in its own search path instead of the current folder.

#include <filesystem>
#include <string>

#include "ctxgen/error.h"

namespace ctxgen {

// `path` made absolute against the current folder, after checking that it names (following links)
// a regular file holding a shared object for this machine whose headers and loadable segments lie
// within the file. Throws Error(`code`) naming `what` (the option) and the file otherwise.
std::filesystem::path checked_library(const std::filesystem::path& path, const std::string& what, ErrorCode code);

}  // namespace ctxgen
