#pragma once

// A PEM file of the gRPC layer's TLS, read whole (door.cpp, parent_channel.cpp).

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace doorman::grpc_door {

// The file at `path`; throws std::runtime_error naming `what` and the path when it cannot.
inline std::string read_pem(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string(what) + ": cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace doorman::grpc_door
