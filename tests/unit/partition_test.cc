// The partitioner with a fake backend that supports a given set of op types.

#include <gtest/gtest.h>

#include <map>
#include <functional>
#include <random>
#include <set>

#include "ctxgen/partition.h"

namespace ctxgen {
namespace {

struct GraphBuilder {
  onnx::GraphProto graph;
  GraphBuilder& input(const std::string& name) {
    graph.add_input()->set_name(name);
    return *this;
  }
  GraphBuilder& output(const std::string& name) {
    graph.add_output()->set_name(name);
    return *this;
  }
  GraphBuilder& node(const std::string& name, const std::string& op, std::vector<std::string> ins,
                     std::vector<std::string> outs) {
    auto* n = graph.add_node();
    n->set_name(name);
    n->set_op_type(op);
    for (auto& i : ins) n->add_input(i);
    for (auto& o : outs) n->add_output(o);
    return *this;
  }
};

PartitionPlan plan_for(const onnx::GraphProto& graph, const std::set<std::string>& supported_ops,
                       const std::unordered_set<std::string>& constants = {}) {
  return partition_graph(graph, constants, [&](size_t i) {
    const auto& op = graph.node(static_cast<int>(i)).op_type();
    return supported_ops.count(op) ? NodeSupport::yes() : NodeSupport::no("fake backend lacks " + op);
  });
}

std::vector<std::vector<std::string>> names(const onnx::GraphProto& graph, const PartitionPlan& plan) {
  std::vector<std::vector<std::string>> out;
  for (const auto& p : plan.partitions) {
    out.emplace_back();
    for (size_t i : p.nodes) out.back().push_back(graph.node(static_cast<int>(i)).name());
  }
  return out;
}

// A plan is valid when contracting each partition to one node leaves the graph acyclic.
bool acyclic_after_fusion(const onnx::GraphProto& graph, const PartitionPlan& plan) {
  size_t n = static_cast<size_t>(graph.node_size());
  std::vector<int> unit(n);
  for (size_t i = 0; i < n; ++i) unit[i] = static_cast<int>(plan.partitions.size() + i);
  for (size_t p = 0; p < plan.partitions.size(); ++p)
    for (size_t i : plan.partitions[p].nodes) unit[i] = static_cast<int>(p);
  std::map<std::string, int> producer;
  for (size_t i = 0; i < n; ++i)
    for (const auto& o : graph.node(static_cast<int>(i)).output()) producer[o] = unit[i];
  std::map<int, std::set<int>> edges;
  for (size_t i = 0; i < n; ++i)
    for (const auto& in : graph.node(static_cast<int>(i)).input())
      if (producer.count(in) && producer[in] != unit[i]) edges[producer[in]].insert(unit[i]);
  std::map<int, int> state;  // 1 visiting, 2 done
  std::function<bool(int)> dfs = [&](int u) {
    state[u] = 1;
    for (int v : edges[u]) {
      if (state[v] == 1) return false;
      if (state[v] == 0 && !dfs(v)) return false;
    }
    state[u] = 2;
    return true;
  };
  for (const auto& [u, _] : edges)
    if (state[u] == 0 && !dfs(u)) return false;
  return true;
}

TEST(Partition, AllSupportedIsOnePartition) {
  GraphBuilder b;
  b.input("x").output("y").node("a", "Relu", {"x"}, {"t"}).node("b", "Tanh", {"t"}, {"y"});
  auto plan = plan_for(b.graph, {"Relu", "Tanh"});
  ASSERT_EQ(plan.partitions.size(), 1u);
  EXPECT_EQ(plan.partitions[0].inputs, (std::vector<std::string>{"x"}));
  EXPECT_EQ(plan.partitions[0].outputs, (std::vector<std::string>{"y"}));
  EXPECT_TRUE(plan.cpu_nodes.empty());
}

TEST(Partition, CpuIslandsSplitAChain) {
  GraphBuilder b;
  b.input("x").output("y")
      .node("a", "Relu", {"x"}, {"t1"})
      .node("cpu1", "Floor", {"t1"}, {"t2"})
      .node("b", "Relu", {"t2"}, {"t3"})
      .node("cpu2", "Floor", {"t3"}, {"t4"})
      .node("c", "Relu", {"t4"}, {"y"});
  auto plan = plan_for(b.graph, {"Relu"});
  EXPECT_EQ(names(b.graph, plan), (std::vector<std::vector<std::string>>{{"a"}, {"b"}, {"c"}}));
  ASSERT_EQ(plan.cpu_nodes.size(), 2u);
  EXPECT_EQ(plan.cpu_nodes[0].reason, "fake backend lacks Floor");
}

TEST(Partition, NeverFusesAcrossACpuDetour) {
  // a -> cpu -> c and a -> c: putting a and c together would need cpu's output inside the fused node.
  GraphBuilder b;
  b.input("x").output("y")
      .node("a", "Relu", {"x"}, {"t1"})
      .node("cpu", "Floor", {"t1"}, {"t2"})
      .node("c", "Add", {"t1", "t2"}, {"y"});
  auto plan = plan_for(b.graph, {"Relu", "Add"});
  EXPECT_EQ(names(b.graph, plan), (std::vector<std::vector<std::string>>{{"a"}, {"c"}}));
  EXPECT_EQ(plan.partitions[0].outputs, (std::vector<std::string>{"t1"}));
  EXPECT_EQ(plan.partitions[1].inputs, (std::vector<std::string>{"t1", "t2"}));
  EXPECT_TRUE(acyclic_after_fusion(b.graph, plan));
}

TEST(Partition, IndependentBranchesShareAPartition) {
  GraphBuilder b;
  b.input("x").output("y1").output("y2")
      .node("cpu", "Floor", {"x"}, {"f"})
      .node("a", "Relu", {"f"}, {"y1"})
      .node("b", "Tanh", {"f"}, {"y2"});
  auto plan = plan_for(b.graph, {"Relu", "Tanh"});
  EXPECT_EQ(names(b.graph, plan), (std::vector<std::vector<std::string>>{{"a", "b"}}));
  EXPECT_EQ(plan.partitions[0].outputs, (std::vector<std::string>{"y1", "y2"}));
}

TEST(Partition, OutputsReadInsideAndOutsideAreBoundaryValues) {
  GraphBuilder b;
  b.input("x").output("y").output("t")
      .node("a", "Relu", {"x"}, {"t"})
      .node("b", "Relu", {"t"}, {"u"})
      .node("cpu", "Floor", {"t"}, {"v"})
      .node("c", "Add", {"u", "v"}, {"y"});
  auto plan = plan_for(b.graph, {"Relu", "Add"});
  ASSERT_EQ(plan.partitions.size(), 2u);
  EXPECT_EQ(names(b.graph, plan)[0], (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(plan.partitions[0].outputs, (std::vector<std::string>{"t", "u"}));
  EXPECT_TRUE(acyclic_after_fusion(b.graph, plan));
}

TEST(Partition, ConstantsAreNotInputs) {
  GraphBuilder b;
  b.input("x").output("y").node("mm", "MatMul", {"x", "w"}, {"y"});
  auto plan = plan_for(b.graph, {"MatMul"}, {"w"});
  ASSERT_EQ(plan.partitions.size(), 1u);
  EXPECT_EQ(plan.partitions[0].inputs, (std::vector<std::string>{"x"}));
  EXPECT_EQ(plan.partitions[0].constants, (std::vector<std::string>{"w"}));
}

TEST(Partition, SubgraphReadsCountAsUsesOutsideThePartition) {
  GraphBuilder b;
  b.input("x").input("cond").output("y").node("a", "Relu", {"x"}, {"t"});
  auto* if_node = b.graph.add_node();
  if_node->set_name("if");
  if_node->set_op_type("If");
  if_node->add_input("cond");
  if_node->add_output("y");
  auto* branch = if_node->add_attribute();
  branch->set_name("then_branch");
  auto* g = branch->mutable_g();
  auto* inner = g->add_node();
  inner->set_op_type("Identity");
  inner->add_input("t");  // outer-scope value
  inner->add_output("inner_y");
  g->add_output()->set_name("inner_y");
  auto plan = plan_for(b.graph, {"Relu"});
  ASSERT_EQ(plan.partitions.size(), 1u);
  EXPECT_EQ(plan.partitions[0].outputs, (std::vector<std::string>{"t"}));
}

TEST(Partition, DeadPartitionsStayOnCpu) {
  GraphBuilder b;
  b.input("x").output("y").node("cpu", "Floor", {"x"}, {"y"}).node("dead", "Relu", {"x"}, {"unused"});
  auto plan = plan_for(b.graph, {"Relu"});
  EXPECT_TRUE(plan.partitions.empty());
  ASSERT_EQ(plan.cpu_nodes.size(), 2u);
  EXPECT_EQ(plan.cpu_nodes[1].reason, "its results are never used");
}

// Random DAGs with random support: every plan must be acyclic after fusion, cover every node
// exactly once, and be the same when computed twice.
TEST(Partition, RandomGraphsGiveValidDeterministicPlans) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 2000; ++round) {
    GraphBuilder b;
    b.input("x");
    int n = 2 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> ins;
      int fan_in = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < fan_in; ++k) ins.push_back(i == 0 || rng() % 5 == 0 ? "x" : "v" + std::to_string(rng() % i));
      b.node("n" + std::to_string(i), rng() % 3 == 0 ? "Cpu" : "Npu", ins, {"v" + std::to_string(i)});
    }
    b.output("v" + std::to_string(n - 1));
    auto plan = plan_for(b.graph, {"Npu"});
    ASSERT_TRUE(acyclic_after_fusion(b.graph, plan)) << b.graph.DebugString();
    size_t covered = plan.cpu_nodes.size();
    for (const auto& p : plan.partitions) covered += p.nodes.size();
    EXPECT_EQ(covered, static_cast<size_t>(n));
    // A copy, so a plan that depended on where nodes live in memory would differ.
    const onnx::GraphProto copy = b.graph;
    EXPECT_EQ(names(b.graph, plan), names(copy, plan_for(copy, {"Npu"})));
  }
}

}  // namespace
}  // namespace ctxgen
