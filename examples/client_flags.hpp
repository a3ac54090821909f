#pragma once

// The flags every client example takes (--server, --resource), and the client options they
// give: the servers' addresses, and the client's log lines on stderr.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <doorman/client/client.hpp>
#include <doorman/net/address.hpp>

#include "arguments.hpp"
#include "flags.hpp"

namespace doorman_examples {

struct client_flags {
  std::string server = "127.0.0.1:7700";  // --server HOST:PORT[,HOST:PORT...]
  std::string resource;                   // --resource ID
  bool server_given = false;              // --server was passed

  // These flags, then `more`.
  std::vector<flag_action> with(std::vector<flag_action> more) {
    more.push_back({"--server", [this](arguments& a) {
                      server = a.value();
                      server_given = true;
                    }});
    more.push_back({"--resource", [this](arguments& a) { resource = a.value(); }});
    return more;
  }

  // The options of a client of `--server`, logging to stderr.
  [[nodiscard]] doorman::client_options client_options() const {
    doorman::client_options o;
    o.addresses = doorman::net::split_list(server);
    o.log = [](std::string_view line) { log_line(line); };
    return o;
  }
};

}  // namespace doorman_examples
