// Executable: a graph of a context binary, validated once and run from several threads.

#include <thread>

#include "ctxgen/format.h"
#include "runtime_test_util.h"

namespace ctxgen::testing {
namespace {

// y = Relu(x [2,2] x W [2,2]) + x, with W a weight of the binary.
struct Binary {
  ref::Program program;
  std::vector<uint8_t> bytes;
  std::shared_ptr<const ContextBinary> binary;

  explicit Binary(std::function<void(CompiledGraph&, ref::Program&)> tamper = {}, size_t weight_count = 1) {
    ProgramBuilder b;
    int32_t x = b.input({2, 2});
    int32_t w = b.weight({2, 2}, 0);
    int32_t t = b.arena({2, 2});
    int32_t y = b.output({2, 2});
    b.op("MatMul", {x, w}, t, {int_attr("act", 1)});
    b.op("Add", {t, x}, y);
    program = b.program();
    CompiledGraph g;
    g.name = "g";
    g.inputs = {{"x", 1, {2, 2}}};
    g.outputs = {{"y", 1, {2, 2}}};
    g.weight_ids = {0};
    if (tamper) tamper(g, program);
    g.program = ref::serialize(program);
    std::vector<WeightPayload> weights;
    for (size_t i = 0; i < weight_count; ++i) {  // W, then W doubled
      const float k = static_cast<float>(i + 1);
      Blob w_blob = Blob::owned(f32({k, -k, 2 * k, 0}));
      weights.push_back({xxh3_128(w_blob.data, w_blob.size), w_blob});
    }
    write_context_binary({"ref", "1", "cpu"}, {g}, weights,
                         [&](const uint8_t* data, size_t size) { bytes.insert(bytes.end(), data, data + size); });
    binary = ContextBinary::from_memory(bytes.data(), bytes.size(), nullptr, "test.bin");
  }
};

TEST(RuntimeExecutable, RunsAGraphOfABinary) {
  Binary b;
  runtime::Executable exe(b.binary, "g");
  EXPECT_EQ(exe.graph().name, "g");
  EXPECT_EQ(exe.program().ops.size(), 2u);
  // x W = [[1,2],[3,4]] x [[1,-1],[2,0]] = [[5,-1],[11,-3]]; Relu, then + x.
  std::vector<float> x = {1, 2, 3, 4}, y(4);
  exe.run({x.data()}, {y.data()});
  expect_near(y, {6, 2, 14, 4});
}

// The path the plugin EP takes: after the first run, a run of the executable allocates nothing,
// whichever of the caller's buffers it is given.
TEST(RuntimeExecutable, RunsAfterTheFirstAllocateNothing) {
  Binary b;
  runtime::Executable exe(b.binary, "g");
  std::vector<float> x = {1, 2, 3, 4}, other = {4, 3, 2, 1}, y(4), z(4);
  const std::vector<const void*> in = {x.data()}, other_in = {other.data()};
  const std::vector<void*> out = {y.data()}, other_out = {z.data()};
  exe.run(in, out);
  const uint64_t before = allocations_so_far();
  exe.run(other_in, other_out);
  exe.run(in, out, serial_tasks);
  EXPECT_EQ(allocations_so_far() - before, 0u);
  expect_near(y, {6, 2, 14, 4});
  expect_near(z, {14, 3, 6, 1});
}

// An op computed from weights alone (a weight dequantized, laid out) runs once, when the program is
// prepared: changing the weight's bytes afterwards changes no run, and the runs read the value the
// first computation made.
TEST(RuntimeExecutable, ValuesComputedFromWeightsAloneAreComputedOnce) {
  ProgramBuilder b;
  const int32_t x = b.input({4});
  const int32_t w = b.weight({4}, 0, ref::DType::kInt8), scale = b.weight({}, 1);
  const int32_t dq = b.arena({4}), y = b.output({4});
  b.op("DequantizeLinear", {w, scale}, dq, {int_attr("axis", 0), int_attr("block_size", 0)});
  b.op("Add", {x, dq}, y);
  std::vector<Bytes> weights = {bytes_of<int8_t>({1, -2, 3, -128}), f32({0.5f})};
  runtime::PreparedProgram prepared(b.program(), [&](uint32_t id) { return weights.at(id).data(); });
  // Overwritten in place: the program reads the buffers it was prepared with.
  const auto overwrite = [&](size_t i, const Bytes& bytes) { std::copy(bytes.begin(), bytes.end(), weights[i].begin()); };
  overwrite(0, bytes_of<int8_t>({0, 0, 0, 0}));
  overwrite(1, f32({100.0f}));
  const Bytes in = f32({10, 20, 30, 40});
  Bytes out(16);
  for (int run = 0; run < 2; ++run) {
    prepared.run({in.data()}, {out.data()});
    EXPECT_EQ(values_of<float>(out), (std::vector<float>{10.5f, 19, 31.5f, -24}));
  }
}

// Computed once only within a budget (the arena plus 16 times the weights): two such values that
// the program's memory plan lays on the same arena bytes cannot both be held, so the second is
// computed on every run, from the weight as it is then.
TEST(RuntimeExecutable, ValuesComputedOnceStayWithinTheirBudget) {
  ProgramBuilder b;
  const int32_t x = b.input({1000});
  const int32_t w = b.weight({1}, 0);
  const int32_t first = b.arena({1000}, 0), second = b.arena({1000}, 0);  // the same bytes, one after the other
  const int32_t y = b.output({1000}), z = b.output({1000});
  b.op("Expand", {w}, first, {ints_attr("shape", {1000})});
  b.op("Add", {x, first}, y);
  b.op("Expand", {w}, second, {ints_attr("shape", {1000})});
  b.op("Add", {x, second}, z);
  std::vector<Bytes> weights = {f32({1.0f})};
  runtime::PreparedProgram prepared(b.program(), [&](uint32_t id) { return weights.at(id).data(); });
  const Bytes five = f32({5.0f});
  std::copy(five.begin(), five.end(), weights[0].begin());  // in place: the program reads this buffer
  const Bytes in = f32(std::vector<float>(1000, 10.0f));
  Bytes out_y(4000), out_z(4000);
  prepared.run({in.data()}, {out_y.data(), out_z.data()});
  EXPECT_EQ(values_of<float>(out_y), std::vector<float>(1000, 11.0f)) << "computed once, when prepared";
  EXPECT_EQ(values_of<float>(out_z), std::vector<float>(1000, 15.0f)) << "past the budget: computed on the run";
}

TEST(RuntimeExecutable, RunsConcurrently) {
  Binary b;
  const runtime::Executable exe(b.binary, "g");
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> results(4, std::vector<float>(4));
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] {
      std::vector<float> x = {1, 2, 3, static_cast<float>(i)};
      for (int rep = 0; rep < 200; ++rep) exe.run({x.data()}, {results[i].data()});
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    float f = static_cast<float>(i);
    // Row 2: [3, i] x W = [3 + 2i, -3]: Relu -> [3 + 2i, 0], + x.
    expect_near(results[i], {6, 2, 6 + 2 * f, f});
  }
}

// The process keeps the programs it read and validated, by their bytes, and another binary with
// the same bytes takes the one kept; but those bytes are only valid with the binary's weights: the
// same program reads weight 1 of a binary that has it, and is refused in one that does not.
TEST(RuntimeExecutable, AProgramValidatedBeforeIsCheckedAgainstEachBinary) {
  const auto reads_weight_1 = [](CompiledGraph& g, ref::Program& p) {
    p.values[1].index = 1;
    g.weight_ids = {1};
  };
  Binary two(reads_weight_1, 2);
  runtime::Executable exe(two.binary, "g");
  std::vector<float> x = {1, 2, 3, 4}, y(4);
  exe.run({x.data()}, {y.data()});
  expect_near(y, {11, 2, 25, 4});  // x (2 W) = [[10,-2],[22,-6]]: Relu, then + x
  Binary again(reads_weight_1, 2);  // another binary with the same bytes: its program is not read again
  const uint64_t before = runtime::programs_validated();
  runtime::Executable(again.binary, "g").run({x.data()}, {y.data()});
  EXPECT_EQ(runtime::programs_validated(), before);
  expect_near(y, {11, 2, 25, 4});
  Binary one([](CompiledGraph&, ref::Program& p) { p.values[1].index = 1; }, 1);
  ASSERT_EQ(ref::serialize(one.program), ref::serialize(two.program));
  expect_error([&] { runtime::Executable(one.binary, "g"); }, ErrorCode::kInvalidBinary,
               "test.bin: graph 'g': ref program: value 1 (weight) refers to weight 1, the binary has 1");
}

TEST(RuntimeExecutable, RejectsMissingGraphsAndBadPrograms) {
  Binary good;
  expect_error([&] { runtime::Executable(good.binary, "h"); }, ErrorCode::kInvalidBinary,
               "test.bin: no graph named 'h'");
  Binary bad_weight([](CompiledGraph&, ref::Program& p) { p.values[1].index = 1; });
  expect_error([&] { runtime::Executable(bad_weight.binary, "g"); }, ErrorCode::kInvalidBinary,
               "test.bin: graph 'g': ref program: value 1 (weight) refers to weight 1, the binary has 1");
  Binary big_weight([](CompiledGraph&, ref::Program& p) {
    for (size_t v : {1, 2, 3}) p.values[v].dims = {4, 2, 2};  // W, x W and y batched
    p.arena_bytes = 64;
  });
  expect_error([&] { runtime::Executable(big_weight.binary, "g"); }, ErrorCode::kInvalidBinary,
               "value 1 reads 64 bytes of weight 0, which has 16");
  // A program from another graph (or binary) reads weights its record does not list.
  Binary unlisted([](CompiledGraph& g, ref::Program&) { g.weight_ids = {}; });
  expect_error([&] { runtime::Executable(unlisted.binary, "g"); }, ErrorCode::kInvalidBinary,
               "value 1 reads weight 0, which the graph record does not list");
  Binary bad_signature([](CompiledGraph& g, ref::Program&) { g.outputs[0].dims = {4}; });
  expect_error([&] { runtime::Executable(bad_signature.binary, "g"); }, ErrorCode::kInvalidBinary,
               "output 0 'y' has type 1 dims [4] in the graph record, type 1 dims [2,2] in its program");
}

TEST(RuntimeExecutable, ChecksBufferCounts) {
  Binary b;
  runtime::Executable exe(b.binary, "g");
  std::vector<float> x(4), y(4);
  expect_error([&] { exe.run({x.data(), x.data()}, {y.data()}); }, ErrorCode::kRuntime,
               "2 input buffers given, the graph has 1");
}

}  // namespace
}  // namespace ctxgen::testing
