// libFuzzer target: Doorman's gRPC messages from any bytes, as the gRPC door takes them. Each
// input picks a method and is parsed as its proto2 request; one that parses is mapped to
// doorman's request (src/grpc/mapping.cpp) and decided by an engine through the one service
// call path. Properties: nothing crashes; a refusal names a field of the proto request; an
// answer maps back to a response with every required field set, which serializes and parses
// back; the engine invariants hold after every call (fuzz_support.hpp).

#include <cstddef>
#include <cstdint>
#include <string>

#include <doorman/protocol/service.hpp>

#include "doorman.pb.h"
#include "fuzz_support.hpp"
#include "mapping.hpp"

using namespace doorman_fuzz;

namespace {

constexpr double now_unix = 1.8e9;

engine_type& engine() {
  static engine_type eng(engine_type::parse_config(config_text()));
  return eng;
}

void check_refusal(const std::string& message, const char* list) {
  const std::string path = doorman::grpc_door::proto_path(message, list);
  const bool named = path.starts_with(std::string(list) + "[") || path.starts_with("client_id") ||
                     path.starts_with("server_id");
  DOORMAN_FUZZ_CHECK(named, path);
}

template <class Response>
void check_answer(const Response& out) {
  DOORMAN_FUZZ_CHECK(out.IsInitialized(), out.InitializationErrorString());
  std::string bytes;
  DOORMAN_FUZZ_CHECK(out.SerializeToString(&bytes), "serialize");
  Response back;
  DOORMAN_FUZZ_CHECK(back.ParseFromString(bytes), "parse back");
}

template <class M, class Request, class Response, class Map>
void drive(const Request& in, const char* list, Map map) {
  auto& eng = engine();
  const auto now = clock_type::time_point{} + std::chrono::seconds(100);
  const auto r = doorman::call_method<M>(eng, map(in), now, {});
  if (!r) {
    DOORMAN_FUZZ_CHECK(r.code() == doorman::rpc_code::invalid_params, r.message());
    check_refusal(r.message(), list);
    return;
  }
  Response out;
  if constexpr (requires { doorman::grpc_door::to_proto(r.value(), now_unix, out); }) {
    doorman::grpc_door::to_proto(r.value(), now_unix, out);
  } else {
    doorman::grpc_door::to_proto(r.value(), out);
  }
  check_answer(out);
  check_engine(eng, now, now);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int method = data[0] % 3;
  const auto* body = data + 1;
  const auto n = static_cast<int>(size - 1);
  if (method == 0) {
    ::doorman::GetCapacityRequest in;
    if (!in.ParseFromArray(body, n)) return 0;
    drive<doorman::methods::get_capacity, ::doorman::GetCapacityRequest,
          ::doorman::GetCapacityResponse>(
        in, "resource", [](const auto& r) { return doorman::grpc_door::from_proto(r, now_unix); });
  } else if (method == 1) {
    ::doorman::GetServerCapacityRequest in;
    if (!in.ParseFromArray(body, n)) return 0;
    drive<doorman::methods::get_server_capacity, ::doorman::GetServerCapacityRequest,
          ::doorman::GetServerCapacityResponse>(
        in, "resource", [](const auto& r) { return doorman::grpc_door::from_proto(r, now_unix); });
  } else {
    ::doorman::ReleaseCapacityRequest in;
    if (!in.ParseFromArray(body, n)) return 0;
    drive<doorman::methods::release_capacity, ::doorman::ReleaseCapacityRequest,
          ::doorman::ReleaseCapacityResponse>(
        in, "resource_id", [](const auto& r) { return doorman::grpc_door::from_proto(r); });
  }
  return 0;
}
