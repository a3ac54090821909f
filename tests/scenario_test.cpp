// The client behaviours of tests/client_scenarios.json, which the Python client's tests run too
// (python/tests/test_scenarios.py): the same steps against real doorman-node processes, so
// that the two clients cannot drift apart.

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include <doorman/client.hpp>
#include <nlohmann/json.hpp>

#include "line_client.hpp"
#include "process.hpp"
#include "support.hpp"

namespace {

using json = nlohmann::json;
using doorman_examples::process;

// A peer of the tests on a free port of 127.0.0.1: each connection, one after the other, is
// handed to `serve(fd)`, then closed.
class loopback_peer {
 public:
  using serve_type = std::function<void(int)>;
  explicit loopback_peer(serve_type serve) : serve_(std::move(serve)) {
    std::tie(fd_, address_) = doorman_test::listen_on_loopback(64);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;  // shut down
        serve_(c);
        ::close(c);
      }
    });
  }
  loopback_peer(const loopback_peer&) = delete;
  loopback_peer& operator=(const loopback_peer&) = delete;
  ~loopback_peer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  [[nodiscard]] const std::string& address() const { return address_; }

 private:
  serve_type serve_;
  int fd_ = -1;
  std::string address_;
  std::thread thread_;
};

// Accepts every connection and closes it at once (as a node over its connection limit does),
// counting them.
struct closing_server {
  std::atomic<int> accepted{0};
  loopback_peer peer{[this](int) { ++accepted; }};
};

// A task that is not master: it answers every request line with the master's address, until
// the client closes the connection.
void redirect_to(const std::string& master, int c) {
  std::string in;
  char chunk[4096];
  for (;;) {
    const auto n = ::recv(c, chunk, sizeof chunk, 0);
    if (n <= 0) return;
    in.append(chunk, static_cast<std::size_t>(n));
    for (auto end = in.find('\n'); end != std::string::npos; end = in.find('\n')) {
      const json request = json::parse(in.substr(0, end), nullptr, false);
      in.erase(0, end + 1);
      const json reply = {{"jsonrpc", "2.0"},
                          {"id", request.is_object() ? request.value("id", json()) : json()},
                          {"result",
                           {{"mastership", {{"is_master", false}, {"master", master}}},
                            {"resources", json::array()}}}};
      const std::string line = reply.dump() + "\n";
      ::send(c, line.data(), line.size(), MSG_NOSIGNAL);
    }
  }
}

// One scenario's world: its node, clients and resources.
class scenario_run {
 public:
  scenario_run(const json& scenario, const std::filesystem::path& dir) : dir_(dir) {
    const json n = scenario.value("node", json::object());
    json r = {{"identifier_glob", "*"},
              {"capacity", n.value("capacity", 100.0)},
              {"algorithm",
               {{"kind", "FAIR_SHARE"},
                {"lease_length", n.value("lease_length", 5)},
                {"refresh_interval", n.value("refresh_interval", 1)},
                {"learning_mode_duration", 0}}}};
    if (n.contains("safe_capacity")) r["safe_capacity"] = n["safe_capacity"];
    std::ofstream(dir_ / "config.json") << json{{"resources", json::array({r})}}.dump();
    node_ = std::make_unique<process>(
        std::vector<std::string>{DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--admin", "off",
                                 "--config", (dir_ / "config.json").string(),
                                 "--minimum-refresh-interval", "0"},
        (dir_ / "node.log").string());
    const auto at = node_->listening_address();
    REQUIRE(at);
    node_at_ = *at;
  }
  scenario_run(const scenario_run&) = delete;
  scenario_run& operator=(const scenario_run&) = delete;
  ~scenario_run() {
    resources_.clear();
    clients_.clear();
    stop_node();
  }

  void step(const json& s) {
    INFO(s.dump());
    if (s.contains("rate")) {
      doorman::resource_options o;
      if (s.contains("wants")) o.wants = s["wants"].get<double>();
      const auto mode = s.value("mode", std::string("safe"));
      o.mode = mode == "pessimistic"  ? doorman::fallback::pessimistic
               : mode == "optimistic" ? doorman::fallback::optimistic
                                      : doorman::fallback::safe;
      resources_[{s["client"], s["rate"]}] = std::make_unique<doorman::rate_resource>(
          *clients_.at(s["client"]), s["rate"].get<std::string>(), o);
    } else if (s.contains("expect")) {
      const json& e = s["expect"];
      auto& r = *resources_.at({e["client"], e["resource"]});
      const double within = s["within"].get<double>();
      bool ok = false;
      if (e.contains("capacity")) {
        ok = eventually([&] { return r.capacity() == e["capacity"].get<double>(); }, within);
      } else if (e.contains("capacity_above")) {
        ok = eventually([&] { return r.capacity() > e["capacity_above"].get<double>(); }, within);
      } else {
        ok = eventually([&] { return r.leased() == e["leased"].get<bool>(); }, within);
      }
      INFO("capacity " << r.capacity() << ", leased " << r.leased());
      CHECK(ok);
    } else if (s.contains("try_acquire")) {
      const json& a = s["try_acquire"];
      const auto got = resources_.at({a["client"], a["resource"]})->try_acquire(a.value("n", 1.0));
      CHECK(bool(got) == s["admitted"].get<bool>());
      if (s.value("retry_after_infinite", false)) {
        CHECK(got.retry_after == decltype(got.retry_after)::max());
      }
      if (s.contains("retry_after_at_most")) {
        const double seconds = std::chrono::duration<double>(got.retry_after).count();
        CHECK(seconds <= s["retry_after_at_most"].get<double>());
        CHECK(seconds > 0);
      }
    } else if (s.contains("stop")) {
      clients_.at(s["stop"])->stop();  // its handles stay: they must admit nothing now
    } else if (s.contains("stop_node")) {
      stop_node();
    } else if (s.contains("close")) {
      // Its handles go first (they must not outlive it), then the client: its destructor
      // stops it and waits, the release included.
      const std::string name = s["close"];
      std::erase_if(resources_, [&](const auto& r) { return r.first.first == name; });
      auto c = std::move(clients_.at(name));
      clients_.erase(name);
      const double bound = c->options().release_timeout.count() + 0.5;
      const auto start = std::chrono::steady_clock::now();
      c.reset();
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::duration<double>(bound));
    } else if (s.contains("node_leases")) {
      const json& n = s["node_leases"];
      CHECK(node_leases(n["resource"]) == n["count"].get<std::size_t>());
    } else if (s.contains("closing_server")) {
      closing_ = std::make_unique<closing_server>();
    } else if (s.contains("connections_below")) {
      REQUIRE(closing_);
      // The measured span: what that much refusal costs.
      std::this_thread::sleep_for(std::chrono::duration<double>(s["during"].get<double>()));
      CHECK(closing_->accepted.load() < s["connections_below"].get<int>());
      CHECK(closing_->accepted.load() > 0);
    } else if (s.contains("redirecting_server")) {
      follower_ =
          std::make_unique<loopback_peer>([master = node_at_](int c) { redirect_to(master, c); });
    } else if (s.contains("client")) {
      doorman::client_options o;
      const std::string to = s.value("to", "");
      o.addresses = {to == "closing_server" && closing_        ? closing_->peer.address()
                     : to == "redirecting_server" && follower_ ? follower_->address()
                                                               : node_at_};
      const json opts = s.value("options", json::object());
      if (opts.contains("call_timeout")) o.call_timeout = doorman::seconds(opts["call_timeout"]);
      if (opts.contains("release_timeout"))
        o.release_timeout = doorman::seconds(opts["release_timeout"]);
      clients_[s["client"]] = std::make_unique<doorman::client>(o);
    } else {
      FAIL("unknown step " << s.dump());
    }
  }

 private:
  template <class Predicate>
  static bool eventually(Predicate p, double seconds) {
    return doorman_test::eventually(p, std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::duration<double>(seconds)));
  }

  std::size_t node_leases(const std::string& resource) {
    doorman_test::line_client c(node_at_);
    const json reply = c.call("status", {{"resource_id", resource}});
    return reply["result"].value("leases", json::array()).size();
  }

  void stop_node() {
    if (!node_) return;
    node_->signal(SIGTERM);
    CHECK(node_->exits_cleanly());
    node_.reset();
  }

  std::filesystem::path dir_;
  std::unique_ptr<process> node_;
  std::string node_at_;
  std::unique_ptr<closing_server> closing_;
  std::unique_ptr<loopback_peer> follower_;
  std::map<std::string, std::unique_ptr<doorman::client>> clients_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<doorman::rate_resource>> resources_;
};

}  // namespace

TEST_CASE("client scenarios shared with the Python client", "[client][process][scenario]") {
  std::ifstream in(std::string(DOORMAN_SOURCE_DIR) + "/tests/client_scenarios.json");
  const json scenarios = json::parse(in)["scenarios"];
  REQUIRE(scenarios.size() >= 7);
  for (const auto& sc : scenarios) {
    const std::string name = sc["name"];
    INFO(name);
    const auto dir =
        std::filesystem::temp_directory_path() / ("doorman-scenario-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    {
      scenario_run run(sc, dir);
      for (const auto& s : sc["steps"])
        run.step(s);
    }
    std::filesystem::remove_all(dir);
  }
}
