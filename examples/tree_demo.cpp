// doorman-tree-demo: a real capacity tree on loopback — one root and two intermediate
// doorman-node processes — and six scripted clients sharing one resource through it. Prints the
// allocation once a second as it converges, then stops the tree cleanly (or on Ctrl-C).
//
//   doorman-tree-demo [--duration 24] [--capacity 100] [--node-binary PATH]
//
// Script: clients c1..c5 start at once (c1..c3 under the intermediate "left", c4..c5 under
// "right"); c6 joins "right" at 8 s wanting 60; c3 drops its demand to 5 at 14 s; c2 leaves
// (releases its lease) at 18 s. The resource's algorithm is FAIR_SHARE.

#include <doorman/node.hpp>

#include <fmt/format.h>
#include <unistd.h>
#include <asio.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "demo_tree.hpp"

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

struct scripted_client {
  std::string id;
  int node;          // 0 = left, 1 = right
  double wants;      // current demand
  double start;      // seconds after the start
  double change_at;  // when `wants` becomes `later_wants` (< 0: never)
  double later_wants;
  double leave_at;  // when it releases and stops (< 0: never)
  double gets = 0;  // current lease
  bool active = false;
  std::optional<doorman::lease_info> has{};
};

// Weighted max-min fairness of `wants` within `capacity` (one subclient each): the reference.
std::vector<double> fair_shares(const std::vector<double>& wants, double capacity) {
  std::vector<double> out(wants.size(), 0);
  std::vector<std::size_t> order(wants.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return wants[a] < wants[b]; });
  double left = capacity;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const double level = left / static_cast<double>(order.size() - k);
    out[order[k]] = std::min(wants[order[k]], level);
    left -= out[order[k]];
  }
  return out;
}

asio::awaitable<void> run_client(scripted_client& c, doorman::net::channel& ch,
                                 clock_type::time_point t0, clock_type::time_point end,
                                 bool& stop) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_at(t0 + doorman::to_duration<clock_type::duration>(c.start));
  co_await timer.async_wait(asio::use_awaitable);
  c.active = true;
  while (!stop && clock_type::now() < end) {
    const double t = doorman::to_seconds(clock_type::now() - t0);
    if (c.leave_at >= 0 && t >= c.leave_at) {
      // GCC 12 cannot take braced initializers inside co_await: build the request first.
      doorman::release_request release{c.id, {"api"}};
      co_await ch.call<doorman::methods::release_capacity>(std::move(release));
      c.active = false;
      c.gets = 0;
      co_return;
    }
    if (c.change_at >= 0 && t >= c.change_at) c.wants = c.later_wants;
    doorman::capacity_request request{c.id,
                                      {{.resource_id = "api", .wants = c.wants, .has = c.has}}};
    const auto reply = co_await ch.call<doorman::methods::get_capacity>(std::move(request));
    double refresh = 1;
    if (reply && !reply.result.resources.empty()) {
      c.has = reply.result.resources[0].gets;
      c.gets = c.has->capacity;
      refresh = std::clamp(c.has->refresh_interval, 0.1, 5.0);
    }
    // Come back when the lease asks, or at the next script event, whichever is first.
    double next = t + refresh;
    if (c.change_at > t) next = std::min(next, c.change_at);
    if (c.leave_at > t) next = std::min(next, c.leave_at);
    timer.expires_at(t0 + doorman::to_duration<clock_type::duration>(next));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

struct options {
  double duration = 24;
  double capacity = 100;
  std::string node_binary;
};

// One row of the table at `t` seconds: each client's wants -> gets, the total granted, and
// whether every client has its fair share of `capacity`.
struct table_row {
  std::string text;
  double total = 0;
  bool fair = true;
};

table_row row_of(const std::vector<scripted_client>& clients, double t, double capacity) {
  table_row r{fmt::format("{:>4.0f}s ", t)};
  std::vector<double> wants;
  std::vector<double> got;
  for (const auto& c : clients) {
    if (!c.active) {
      r.text += "|          ";
      continue;
    }
    r.text += fmt::format("| {:>3.0f}->{:>3.0f}", c.wants, c.gets);
    r.total += c.gets;
    wants.push_back(c.wants);
    got.push_back(c.gets);
  }
  const auto expected = fair_shares(wants, capacity);
  for (std::size_t i = 0; i < got.size(); ++i)
    r.fair = r.fair && std::abs(got[i] - expected[i]) < 0.01;
  r.text += fmt::format("| {:>5.1f} / {:.0f}{}", r.total, capacity, r.fair ? "  = fair share" : "");
  return r;
}

std::string header_of(const std::vector<scripted_client>& clients) {
  std::string header = "   t  ";
  for (const auto& c : clients)
    header += fmt::format("| {:>2} {:<5}", c.id, c.node == 0 ? "left" : "right");
  return header + "| granted / capacity";
}

// The verdict, and the tree stopped: 0 when it never granted over `capacity` and every node
// exited 0.
int finish(doorman_examples::local_tree& tree, double worst, bool converged_at_end,
           double capacity) {
  fmt::print("\nmost ever granted at once: {:.1f} of {:.0f} ({})\n", worst, capacity,
             worst <= capacity + 1e-9 ? "never over capacity" : "OVER CAPACITY");
  fmt::print("allocation at the end equals the FAIR_SHARE result: {}\n",
             converged_at_end ? "yes" : "no");
  fmt::print("stopping the tree: ");
  const bool clean = tree.stop();
  fmt::print("{}\n", clean ? "every node exited 0" : "a node did not exit cleanly");
  if (clean) std::filesystem::remove_all(tree.dir);
  return clean && worst <= capacity + 1e-9 ? 0 : 1;
}

int run(const options& o) {
  auto tree = doorman_examples::local_tree::start(o.node_binary, o.capacity, "doorman-tree-demo");
  if (!tree) return 1;
  const auto& mid_addresses = tree->mid_addresses;

  std::vector<scripted_client> clients = {
      {"c1", 0, 10, 0, -1, 0, -1}, {"c2", 0, 30, 0, -1, 0, 18}, {"c3", 0, 50, 0, 14, 5, -1},
      {"c4", 1, 20, 0, -1, 0, -1}, {"c5", 1, 40, 0, -1, 0, -1}, {"c6", 1, 60, 8, -1, 0, -1},
  };

  asio::io_context io;
  bool stop = false;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](std::error_code ec, int) {
    if (!ec) {
      fmt::print("\ninterrupted: stopping\n");
      stop = true;
      io.stop();
    }
  });
  const auto t0 = clock_type::now();
  const auto end = t0 + doorman::to_duration<clock_type::duration>(o.duration);
  std::vector<std::unique_ptr<doorman::net::channel>> channels;
  for (auto& c : clients) {
    channels.push_back(std::make_unique<doorman::net::channel>(
        io.get_executor(), doorman::net::channel_options{
                               .addresses = {mid_addresses[static_cast<std::size_t>(c.node)]},
                               .call_timeout = doorman::seconds(1)}));
    asio::co_spawn(io, run_client(c, *channels.back(), t0, end, stop), asio::detached);
  }

  // The table: one row a second.
  fmt::print("wants -> gets per client (lease capacity, requests/s)\n{}\n", header_of(clients));
  double worst = 0;
  bool converged_at_end = false;
  asio::steady_timer tick(io);
  std::function<void(std::error_code)> print = [&](std::error_code ec) {
    if (ec || stop) return;
    const double t = doorman::to_seconds(clock_type::now() - t0);
    const auto row = row_of(clients, t, o.capacity);
    worst = std::max(worst, row.total);
    converged_at_end = row.fair;
    fmt::print("{}\n", row.text);
    if (clock_type::now() >= end) {
      stop = true;
      io.stop();
      return;
    }
    tick.expires_at(t0 + doorman::to_duration<clock_type::duration>(std::floor(t) + 1));
    tick.async_wait(print);
  };
  tick.expires_at(t0 + 1s);
  tick.async_wait(print);
  io.run();

  return finish(*tree, worst, converged_at_end, o.capacity);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  o.node_binary = (std::filesystem::path(argv[0]).parent_path() / "doorman-node").string();
  return doorman_examples::run_program(
      argc, argv, "doorman-tree-demo",
      "usage: doorman-tree-demo [--duration SECONDS] [--capacity N] [--node-binary PATH]\n"
      "  --duration SECONDS  how long the scripted load runs (default 24)\n"
      "  --capacity N        capacity of the resource \"api\" (default 100)\n"
      "  --node-binary PATH  the doorman-node to start (default: next to this program)\n",
      doorman_examples::demo_flags(
          0.001, o.duration, o.capacity,
          {{"--node-binary", [&](auto& args) { o.node_binary = args.value(); }}}),
      [&] {
        if (!std::filesystem::exists(o.node_binary)) {
          throw std::invalid_argument("no doorman-node at " + o.node_binary +
                                      " (build it, or pass --node-binary)");
        }
        return run(o);
      });
}
