#pragma once
// Where a compiled model's run time goes, op by op (CTXGEN_PROFILE=FILE.json): every op a program
// runs in this process, timed, written as a Chrome trace (chrome://tracing, Perfetto) with a
// table of the time by op type.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ctxgen/ref_program.h"

namespace ctxgen::runtime::profile {

// Whether CTXGEN_PROFILE names a file: read once a process.
bool enabled();

using Clock = std::chrono::steady_clock;

// One op's run: `graph` names the program (its graph in the context binary), `index` the op in it.
void record(const std::string& graph, size_t index, const ref::Op& op, const ref::Value& out, Clock::time_point start,
            Clock::time_point end);

// Writes the file if ops ran since it was last written: when a program is let go (a session ends;
// a process may end without running exit handlers, as verify's child does) and at exit.
void save();

}  // namespace ctxgen::runtime::profile
