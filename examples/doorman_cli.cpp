// doorman: look at and steer a capacity tree from a terminal (docs/operations.md), in the spirit
// of Doorman's doorman_shell.
//
//   doorman status [RESOURCE]                   the node and its resources, or one resource
//   doorman get RESOURCE --wants N              ask for capacity as a client
//   doorman release RESOURCE                    give it back
//   doorman discovery                           who is master
//   doorman watch [--interval SECONDS]          a live table, like top (q or Ctrl-C quits)
//   doorman config check FILE                   validate a configuration offline
//   doorman config convert FILE.yml             Doorman's YAML as JSON
//
// Tables for people by default, --json for scripts; --server ADDR[,ADDR...] (default
// 127.0.0.1:7700, or DOORMAN_SERVER) names the tasks of a position, and mastership redirects
// are followed. Exit status: 0 done, 1 failed (unreachable, refused, invalid), 2 bad usage.

#include <doorman/net.hpp>
#include <doorman/protocol.hpp>

#include <fmt/format.h>
#include <asio.hpp>
#include <nlohmann/json.hpp>

#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "cli_answers.hpp"
#include "flags.hpp"
#include "yaml_config.hpp"

namespace {

using json = nlohmann::json;
using namespace doorman_examples::cli;

constexpr const char* usage =
    "usage: doorman COMMAND [ARGS] [--server ADDR[,ADDR...]] [--json] [--timeout SECONDS]\n"
    "Looks at and steers a doorman capacity tree.\n\n"
    "commands:\n"
    "  status [RESOURCE] [--offset N] [--limit N]\n"
    "                                       the node and its resources, or one resource and a "
    "page\n"
    "                                       of its leases (default the first 1000)\n"
    "  get RESOURCE --wants N [--client-id ID] [--priority P]\n"
    "                                       ask for capacity as a client; prints the lease\n"
    "  release RESOURCE [--client-id ID]    give a client's capacity back\n"
    "  discovery                            who is master of the position\n"
    "  watch [--interval SECONDS]           the resources, refreshed in place (q or Ctrl-C "
    "quits)\n"
    "  config check FILE                    validate a configuration (JSON or Doorman's YAML)\n"
    "  config convert FILE                  print a configuration as JSON\n\n"
    "options:\n"
    "  --server ADDR[,ADDR...]              the position's tasks (default 127.0.0.1:7700, or "
    "DOORMAN_SERVER)\n"
    "  --json                               print the server's answer as JSON\n"
    "  --timeout SECONDS                    deadline of each call (default 5)\n"
    "  --client-id ID                       default doorman-cli@HOSTNAME\n"
    "  --tls-ca FILE                        speak TLS; the server's certificate must chain to "
    "these CAs\n"
    "  --tls-cert FILE --tls-key FILE       this client's certificate (mutual TLS)\n"
    "  --tls-server-name NAME               the name the server's certificate must carry\n"
    "                                       (default: the host of --server)\n"
    "  --version                            print the version and exit\n";

struct options {
  std::vector<std::string> words;  // the command and its positional arguments
  std::string server = "127.0.0.1:7700";
  bool json_output = false;
  double timeout = 5;
  double wants = -1;
  std::int64_t priority = 0;
  std::string client_id;
  double interval = 1;
  std::int64_t offset = 0;
  std::int64_t limit = 1000;
  doorman::net::tls_options tls;
};

std::string default_client_id() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "doorman-cli";
  return std::string("doorman-cli@") + host;
}

options parse(int argc, char** argv, bool& help) {
  options o;
  if (const char* s = std::getenv("DOORMAN_SERVER")) o.server = s;
  o.client_id = default_client_id();
  doorman_examples::arguments args(argc, argv);
  help = !args.parse(usage, [&](const std::string& a) {
    if (a == "--server") {
      o.server = args.value();
    } else if (a == "--json") {
      o.json_output = true;
    } else if (a == "--timeout") {
      o.timeout = args.number(0.01, 3600);
    } else if (a == "--wants") {
      o.wants = args.number(0, 1e15);
    } else if (a == "--priority") {
      o.priority = static_cast<std::int64_t>(args.number(-1e9, 1e9));
    } else if (a == "--client-id") {
      o.client_id = args.value();
    } else if (a == "--interval") {
      o.interval = args.number(0.1, 3600);
    } else if (a == "--offset") {
      o.offset = static_cast<std::int64_t>(args.number(0, 1e9));
    } else if (a == "--tls-ca") {
      o.tls.ca_file = args.value();
    } else if (a == "--tls-cert") {
      o.tls.cert_file = args.value();
    } else if (a == "--tls-key") {
      o.tls.key_file = args.value();
    } else if (a == "--tls-server-name") {
      o.tls.server_name = args.value();
      o.tls.enabled = true;
    } else if (a == "--limit") {
      o.limit = static_cast<std::int64_t>(args.number(1, 1e6));
    } else if (!a.starts_with("--")) {
      o.words.push_back(a);
    } else {
      return false;
    }
    return true;
  });
  return o;
}

// One JSON-RPC call on the master of the position, redirects followed.
class rpc {
 public:
  explicit rpc(const options& o) {
    doorman::net::channel_options c;
    c.addresses = doorman::net::split_list(o.server);
    if (c.addresses.empty()) throw std::invalid_argument("--server: no address given");
    for (const auto& a : c.addresses) {
      if (!doorman::net::parse_address(a)) {
        throw std::invalid_argument(fmt::format("--server: expected host:port, got \"{}\"", a));
      }
    }
    c.call_timeout = doorman::seconds(o.timeout);
    c.maximum_backoff = doorman::seconds(0.5);
    c.tls = o.tls;
    channel_.emplace(io_.get_executor(), std::move(c));
  }
  ~rpc() {
    channel_->shutdown();
    io_.run_for(std::chrono::milliseconds(200));
  }

  json call(const std::string& method, json params) {
    auto f = asio::co_spawn(io_, channel_->call(method, std::move(params)), asio::use_future);
    while (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      // An io_context that ran out of work stays stopped (and run_one_for returns at once)
      // until restarted: after one call has ended, the next needs this.
      if (io_.stopped()) io_.restart();
      io_.run_one_for(std::chrono::milliseconds(50));
    }
    const auto reply = f.get();
    if (!reply) {
      throw failure(
          fmt::format("{} at {}: {}", method,
                      channel_->current().empty() ? std::string("the server") : channel_->current(),
                      reply.message));
    }
    return reply.result;
  }

 private:
  asio::io_context io_;
  std::optional<doorman::net::channel> channel_;
};

int status(const options& o) {
  rpc r(o);
  json params = json::object();
  if (o.words.size() > 1) {
    params["resource_id"] = o.words[1];
    params["offset"] = o.offset;
    params["limit"] = o.limit;
  }
  const auto answer = r.call("status", params);
  if (o.json_output) {
    fmt::print("{}\n", answer.dump(2));
    return 0;
  }
  const auto st = read_status(answer);
  fmt::print("{}{}{}{}", node_line(st), resources_table(st), budgets_table(st), learned_table(st));
  if (o.words.size() > 1) {
    const auto shown = st.status.leases.size();
    const auto all = st.status.lease_count.value_or(0);
    fmt::print("\n{}", leases_table(st));
    if (shown < all) {
      fmt::print("({} of {} leases from {}; --offset and --limit for others)\n", shown, all,
                 o.offset);
    }
  }
  return 0;
}

int get(const options& o) {
  if (o.words.size() != 2) throw std::invalid_argument("get: needs RESOURCE (see --help)");
  if (o.wants < 0) throw std::invalid_argument("get: needs --wants N");
  rpc r(o);
  json request = {{"resource_id", o.words[1]}, {"wants", o.wants}, {"priority", o.priority}};
  const auto answer =
      r.call("get_capacity", {{"client_id", o.client_id}, {"resources", json::array({request})}});
  if (o.json_output) {
    fmt::print("{}\n", answer.dump(2));
    return 0;
  }
  fmt::print("{}", grant_lines(read_answer<doorman::capacity_response>("get_capacity", answer),
                               o.wants, o.client_id));
  return 0;
}

int release(const options& o) {
  if (o.words.size() != 2) throw std::invalid_argument("release: needs RESOURCE (see --help)");
  rpc r(o);
  const auto answer = r.call(
      "release_capacity", {{"client_id", o.client_id}, {"resources", json::array({o.words[1]})}});
  if (o.json_output) {
    fmt::print("{}\n", answer.dump(2));
  } else {
    fmt::print("{}: released for {}\n", o.words[1], o.client_id);
  }
  return 0;
}

int discovery(const options& o) {
  rpc r(o);
  const auto answer = r.call("discovery", json::object());
  if (o.json_output) {
    fmt::print("{}\n", answer.dump(2));
    return 0;
  }
  const auto m = read_answer<doorman::discovery_response>("discovery", answer).mastership;
  if (m.master) {
    fmt::print("master: {}\n", *m.master);
  } else {
    fmt::print("master: unknown (the position has no master right now)\n");
  }
  return 0;
}

volatile std::sig_atomic_t interrupted = 0;

// The terminal in non-canonical mode without echo (so 'q' is read at once), restored on exit.
class raw_terminal {
 public:
  raw_terminal() {
    if (!::isatty(0) || ::tcgetattr(0, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO));
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = ::tcsetattr(0, TCSANOW, &raw) == 0;
  }
  raw_terminal(const raw_terminal&) = delete;
  raw_terminal& operator=(const raw_terminal&) = delete;
  ~raw_terminal() {
    if (active_) ::tcsetattr(0, TCSANOW, &saved_);
  }

 private:
  termios saved_{};
  bool active_ = false;
};

// Waits up to `seconds` for 'q' on stdin; whether to quit.
bool quit_within(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!interrupted) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 200))) > 0) {
      char c = 0;
      if (::read(0, &c, 1) == 1 && (c == 'q' || c == 'Q')) return true;
    }
  }
  return true;
}

int watch(const options& o) {
  std::signal(SIGINT, [](int) { interrupted = 1; });
  std::signal(SIGTERM, [](int) { interrupted = 1; });
  rpc r(o);
  raw_terminal terminal;
  for (std::uint64_t n = 1;; ++n) {
    std::string screen = fmt::format("doorman watch  {}  every {} s  (q quits)  #{}\n\n", o.server,
                                     num(o.interval), n);
    try {  // a failed call or a malformed answer is shown, and the next one is asked for
      const auto st = read_status(r.call("status", json::object()));
      screen += node_line(st) + "\n" + resources_table(st) + budgets_table(st) + learned_table(st);
    } catch (const std::exception& e) {
      screen += fmt::format("cannot read status: {}\n", e.what());
    }
    fmt::print("\x1b[H\x1b[2J{}", screen);
    std::fflush(stdout);
    if (quit_within(o.interval)) break;
  }
  fmt::print("\n");
  return 0;
}

std::string read_file(const std::string& path) {
  auto text = doorman_examples::file_text(path);
  if (!text) throw failure(fmt::format("cannot read {}", path));
  return std::move(*text);
}

int config(const options& o) {
  if (o.words.size() != 3 || (o.words[1] != "check" && o.words[1] != "convert")) {
    throw std::invalid_argument("config: expected config check FILE or config convert FILE");
  }
  const std::string& path = o.words[2];
  const std::string text = read_file(path);
  try {
    const auto repo = doorman_examples::parse_config_any(text, path);
    if (o.words[1] == "convert") {
      fmt::print("{}\n", repo.to_json().dump(2));
    } else {
      const auto n = repo.templates().size();
      fmt::print("{}: ok ({} template{})\n", path, n, n == 1 ? "" : "s");
    }
  } catch (const std::exception& e) {
    throw failure(fmt::format("{}: {}", path, e.what()));
  }
  return 0;
}

int run(const options& o) {
  if (o.words.empty()) throw std::invalid_argument("no command given (see --help)");
  const std::string& c = o.words[0];
  if (c == "status") return status(o);
  if (c == "get") return get(o);
  if (c == "release") return release(o);
  if (c == "discovery") return discovery(o);
  if (c == "watch") return watch(o);
  if (c == "config") return config(o);
  throw std::invalid_argument(fmt::format("unknown command \"{}\" (see --help)", c));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    bool help = false;
    const auto o = parse(argc, argv, help);
    if (help) return 0;
    return run(o);
  } catch (const std::invalid_argument& e) {  // bad usage
    fmt::print(stderr, "doorman: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // a `failure`, or anything else that went wrong
    fmt::print(stderr, "doorman: {}\n", e.what());
    return 1;
  }
}
