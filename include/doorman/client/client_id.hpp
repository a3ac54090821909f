#pragma once

/// \file
/// The client id a process gets when it names none: `hostname:pid:n`, n counting the ids this
/// process made, so two clients of one process (or a client and a tool's own calls) never share
/// an id at the server.

#include <atomic>
#include <cstdint>
#include <string>

#include <unistd.h>

namespace doorman {

inline std::string default_client_id() {
  static std::atomic<std::uint64_t> counter{0};
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string id = host[0] ? host : "localhost";  // without fmt: the client's header is light
  id += ':';
  id += std::to_string(::getpid());
  id += ':';
  id += std::to_string(counter++);
  return id;
}

}  // namespace doorman
